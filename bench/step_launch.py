"""Step launch latency: from ``gsrun``'s start to every task running; prints
``name: value`` lines.

    .venv/bin/python bench/step_launch.py [--nodes 2 4] [--runs 15]
    .venv/bin/python bench/step_launch.py --pty [--nodes 2] [--runs 15]

For each node count N it starts its own cluster (``gpusched up --nodes N`` under a
temporary XDG_STATE_HOME), submits one N-node job whose script runs ``gsrun`` RUNS + 1
times (the first is a warm-up and is not counted), each a step of one task per node
that prints the time it started (``date +%s.%N``), and stops the cluster. Per run:

- launch: the last task's start minus the time taken just before gsrun started (so it
  includes gsrun's own start-up, the step's creation, the nodes' launches and their
  connections to gsrun);
- total: gsrun's start to its exit (launch, the task, its output and end coming back).

With ``--pty``: ``gsrun --pty`` start-up on an idle cluster. One N-node job holds its
allocation (its script sleeps); from a pseudo-terminal of the benchmark's own, RUNS + 1
times (the first a warm-up), ``gsrun --jobid J --pty bash --norc --noprofile -i`` is
started and timed until the remote shell's prompt shows on that terminal; then
``exit`` is typed and gsrun's end awaited.

Figures: the median and the 90th percentile over the runs, in milliseconds; for scale,
a bare interpreter's start, gsrun's (``gsrun --help``), and the machine's load and CPUs
(the figures grow with the load: every step starts several processes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent

SCRIPT = """#!/bin/bash
for i in $(seq {runs}); do
  t0=$(date +%s.%N)
  {bin}/gsrun {flags} sh -c 'date +%s.%N' > {work}/times.$i 2> {work}/err.$i
  rc=$?
  t1=$(date +%s.%N)
  echo "run $i rc $rc t0 $t0 t1 $t1 last $(sort -n {work}/times.$i | tail -1) tasks $(wc -l < {work}/times.$i)"
done
"""


def run(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / args[0]), *args[1:]], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def measure(nodes: int, runs: int, flags: str, show: bool = False) -> list[tuple[float, float]]:
    """(launch, total) seconds of each counted run on a fresh N-node cluster."""
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="gpusched-steplaunch-"))
    os.chmod(root, 0o755)
    env = {**os.environ, "XDG_STATE_HOME": str(root)}
    for name in ("GPUSCHED_SOCKET", "GPUSCHED_CONTROLLERS", "GPUSCHED_CONFIG",
                 "SLURM_JOB_ID", "GPUSCHED_JOB_ID"):
        env.pop(name, None)
    try:
        up = run(env, root, "gpusched", "up", "--nodes", str(nodes), "--gpus", "1")
        if up.returncode != 0:
            raise SystemExit(f"gpusched up failed: {up.stdout}{up.stderr}")
        script = root / "launch.sh"
        script.write_text(SCRIPT.format(runs=runs + 1, bin=BIN, work=root, flags=flags))
        submitted = run(env, root, "gsubmit", "--parsable", "-N", str(nodes), "--gpus",
                        str(nodes), "-t", "30", "-o", str(root / "job.out"), str(script))
        if submitted.returncode != 0:
            raise SystemExit(f"gsubmit failed: {submitted.stderr}")
        out = root / "job.out"
        deadline = time.monotonic() + 300
        while len(lines := run_lines(out)) < runs + 1:
            if any(line.split()[3] != "0" for line in lines):
                break
            if time.monotonic() > deadline:
                text = out.read_text() if out.exists() else ""
                raise SystemExit(f"the job did not finish its runs: {text[-2000:]}")
            time.sleep(0.2)
        results = []
        for line in lines:
            words = line.split()
            if words[3] != "0" or int(words[11]) != nodes:
                errors = (root / f"err.{words[1]}").read_text()
                raise SystemExit(f"a step failed: {line!r} {errors[-1000:]}")
            if words[1] == "1":
                continue  # the warm-up
            t0, t1, last = float(words[5]), float(words[7]), float(words[9])
            if show:
                print(f"# run {words[1]}: launch {(last - t0) * 1000:.0f} ms; gsrun said: "
                      + " | ".join((root / f"err.{words[1]}").read_text().splitlines()))
            results.append((last - t0, t1 - t0))
        return results
    finally:
        run(env, root, "gpusched", "down")
        shutil.rmtree(root, ignore_errors=True)


PROMPT = "pty-bench-prompt> "


def measure_pty(nodes: int, runs: int) -> list[float]:
    """Seconds from starting ``gsrun --pty bash`` to its prompt, per counted run."""
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="gpusched-ptybench-"))
    os.chmod(root, 0o755)
    env = {**os.environ, "XDG_STATE_HOME": str(root), "PS1": PROMPT, "TERM": "xterm"}
    for name in ("GPUSCHED_SOCKET", "GPUSCHED_CONTROLLERS", "GPUSCHED_CONFIG",
                 "SLURM_JOB_ID", "GPUSCHED_JOB_ID"):
        env.pop(name, None)
    try:
        up = run(env, root, "gpusched", "up", "--nodes", str(nodes), "--gpus", "1")
        if up.returncode != 0:
            raise SystemExit(f"gpusched up failed: {up.stdout}{up.stderr}")
        script = root / "hold.sh"
        script.write_text("#!/bin/sh\nexec sleep 3600\n")
        submitted = run(env, root, "gsubmit", "--parsable", "-N", str(nodes), "--gpus",
                        str(nodes), "-t", "60", str(script))
        if submitted.returncode != 0:
            raise SystemExit(f"gsubmit failed: {submitted.stderr}")
        job = submitted.stdout.strip()
        deadline = time.monotonic() + 120
        while "RUNNING" not in run(env, root, "gqueue", "-j", job, "-h", "-o", "%T").stdout:
            if time.monotonic() > deadline:
                raise SystemExit(f"job {job} did not start")
            time.sleep(0.1)
        try:
            return [one_pty_run(env, root, job) for _ in range(runs + 1)][1:]
        finally:  # 'down' leaves running jobs to their supervisors: end it first
            run(env, root, "gcancel", job)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and run(
                    env, root, "gqueue", "-j", job, "-h", "-o", "%T").stdout.strip():
                time.sleep(0.1)
    finally:
        run(env, root, "gpusched", "down")
        shutil.rmtree(root, ignore_errors=True)


def one_pty_run(env: dict[str, str], root: Path, job: str) -> float:
    """One ``gsrun --pty bash``: seconds to its prompt, then ``exit``."""
    import select

    master, slave = os.openpty()
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [str(BIN / "gsrun"), "--jobid", job, "--pty", "bash", "--norc", "--noprofile",
             "-i"], env=env, cwd=root, stdin=slave, stdout=slave, stderr=slave,
            start_new_session=True)
        seen = b""
        while PROMPT.encode() not in seen:
            if not select.select([master], [], [], 30)[0]:
                proc.kill()
                raise SystemExit(f"no prompt from gsrun --pty; seen {seen[-500:]!r}")
            seen += os.read(master, 65536)
        elapsed = time.perf_counter() - t0
        os.write(master, b"exit\r")
        if proc.wait(30) != 0:
            raise SystemExit(f"gsrun --pty exited {proc.returncode}")
        return elapsed
    finally:
        os.close(master)
        os.close(slave)


def run_lines(out: Path) -> list[str]:
    """The job's complete ``run`` lines so far."""
    if not out.exists():
        return []
    return [line for line in out.read_text().splitlines()
            if line.startswith("run ") and len(line.split()) == 12]


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--flags", default="", help="more gsrun flags for every step")
    parser.add_argument("--pty", action="store_true",
                        help="time gsrun --pty bash to its prompt instead")
    parser.add_argument("--show", action="store_true",
                        help="print what gsrun said on stderr in each run (with --flags=-v)")
    args = parser.parse_args()
    if args.runs < 10:
        parser.error("--runs: at least 10")
    for name, argv in (("python_startup_ms", [sys.executable, "-c", "pass"]),
                       ("gsrun_startup_ms", [str(BIN / "gsrun"), "--help"])):
        times = []
        for _ in range(9):
            start = time.perf_counter()
            subprocess.run(argv, capture_output=True, check=True)
            times.append(time.perf_counter() - start)
        print(f"{name}: {statistics.median(times) * 1000:.1f}")
    print(f"load_average_1min: {os.getloadavg()[0]:.1f}")
    print(f"cpus: {os.cpu_count()}")
    for nodes in args.nodes:
        if args.pty:
            prompt = [t * 1000 for t in measure_pty(nodes, args.runs)]
            print(f"pty_nodes_{nodes}_runs: {len(prompt)}")
            print(f"pty_nodes_{nodes}_prompt_ms_median: {statistics.median(prompt):.1f}")
            print(f"pty_nodes_{nodes}_prompt_ms_p90: {percentile(prompt, 0.9):.1f}")
            print(f"pty_nodes_{nodes}_prompt_ms_min: {min(prompt):.1f}")
            sys.stdout.flush()
            continue
        results = measure(nodes, args.runs, args.flags, args.show)
        launch = [r[0] * 1000 for r in results]
        total = [r[1] * 1000 for r in results]
        print(f"nodes_{nodes}_runs: {len(results)}")
        print(f"nodes_{nodes}_launch_ms_median: {statistics.median(launch):.1f}")
        print(f"nodes_{nodes}_launch_ms_p90: {percentile(launch, 0.9):.1f}")
        print(f"nodes_{nodes}_launch_ms_min: {min(launch):.1f}")
        print(f"nodes_{nodes}_gsrun_total_ms_median: {statistics.median(total):.1f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
