"""The shell loop a user writes: ``for i in $(seq 1000); do gsubmit -G 1 --wrap true; done``
on a local cluster of 4 nodes × 4 GPUs, first submit → last job done; prints
``name: value`` lines.

    .venv/bin/python bench/cli_loop.py [--jobs 1000] [--nodes 4] [--gpus 4] [--bin DIR]

Starts its own cluster (``gpusched up --nodes N --gpus G`` under a temporary
XDG_STATE_HOME, stopped at the end). Each ``gsubmit`` is a process of its own, started
when the one before has exited, as in a shell loop; the jobs are trivial one-GPU jobs
(``true``), so they end as fast as they start and the loop is bound by ``gsubmit``.

- ``cli_loop_jobs_per_s``: jobs / (last job's end - first gsubmit's start);
- ``cli_loop_span_s``: that span; ``cli_loop_submit_s``: the loop alone;
- ``cli_loop_gsubmit_median_ms`` / ``_p90_ms``: one ``gsubmit`` in the loop, wall time;
- ``cli_loop_drain_s``: last submit → last job's end;
- ``cli_loop_python_bare_ms``: ``python -I -S -c pass`` of gsubmit's environment, median
  of 21 back to back on the idle cluster just before the loop: the floor under every
  call, which says how fast the machine was at the time (it varies by a quarter on a
  virtual machine from one hour to the next);
- ``cli_loop_cpu_ms_per_job_*``: CPU time (user and system) per job, first submit to
  last end, of the ``gsubmit`` calls, and of the controller, the agents (with their
  supervisors and jobs) and PostgreSQL, each with every process under it
  (bench/daemon_cpu.py); ``cli_loop_cpu_busy_share``: the share of the machine's CPU
  time (all its cores) that was busy meanwhile, whoever used it: near 1, the loop is
  bound by the CPU the whole cluster spends per job rather than by any one wait.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from daemon_cpu import busy_seconds, cpu_of_trees
from starts import start_times

BIN = Path(sys.executable).parent


def submit_loop(gsubmit: Path, count: int, work: Path) -> tuple[list[int], list[float]]:
    """``count`` gsubmit calls one after another; the job ids and each call's seconds."""
    ids, took = [], []
    argv = [str(gsubmit), "--parsable", "-G", "1", "-o", "/dev/null", "--wrap", "true"]
    for _ in range(count):
        began = time.perf_counter()
        result = subprocess.run(argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        took.append(time.perf_counter() - began)
        if result.returncode != 0:
            raise SystemExit(f"gsubmit failed: {result.stderr.decode(errors='replace')}")
        ids.append(int(result.stdout))
    return ids, took


def _children_cpu() -> float:
    """CPU seconds of this process's reaped children (the gsubmit calls) so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_done(ids: list[int], timeout: float) -> list[dict]:  # type: ignore[type-arg]
    """Every job of ``ids`` once none is pending or running; their JOB objects."""
    from gpusched.client import ApiClient

    wanted = ",".join(map(str, ids))
    deadline = time.monotonic() + timeout
    with ApiClient() as client:
        while client.request("GET", f"/v1/jobs?state=PENDING,RUNNING&ids={wanted}&fields=job_id"
                             )["rows"]:
            if time.monotonic() > deadline:
                raise SystemExit(f"the jobs did not finish within {timeout:g} s")
            time.sleep(0.2)
        return list(client.request("GET", f"/v1/jobs?all=1&ids={wanted}")["jobs"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=4, help="GPUs of each node")
    parser.add_argument("--bin", type=Path, default=BIN,
                        help="where gsubmit is (default: this interpreter's environment)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="gpusched-loop-"))
    os.chmod(root, 0o755)
    work = root / "work"
    work.mkdir()
    os.environ["XDG_STATE_HOME"] = str(root / "state")
    os.environ.pop("GPUSCHED_SOCKET", None)
    gpusched = [str(BIN / "gpusched")]
    subprocess.run([*gpusched, "up", "--nodes", str(args.nodes), "--gpus", str(args.gpus)],
                   check=True, stdout=subprocess.DEVNULL)
    try:
        bare = statistics.median(start_times([str(args.bin / "python"), "-I", "-S", "-c",
                                              "pass"], 21))
        daemons_before, busy_before = cpu_of_trees(root), busy_seconds()
        children_before = _children_cpu()
        first = time.time()
        ids, took = submit_loop(args.bin / "gsubmit", args.jobs, work)
        submitted = time.time()
        jobs = wait_done(ids, timeout=600)
        waited = time.time()
        daemons_after, busy_after = cpu_of_trees(root), busy_seconds()
        gsubmit_cpu = _children_cpu() - children_before
    finally:
        subprocess.run([*gpusched, "down"], check=False, stdout=subprocess.DEVNULL)
        shutil.rmtree(root, ignore_errors=True)
    failed = [j for j in jobs if j["state"] != "COMPLETED"]
    if failed or len(jobs) != args.jobs:
        raise SystemExit(f"{len(failed)} of {len(jobs)} jobs did not complete, e.g. {failed[:1]}")
    last = max(datetime.fromisoformat(j["end_time"]).timestamp() for j in jobs)
    took_ms = sorted(t * 1000 for t in took)
    print(f"cli_loop_jobs: {args.jobs}")
    print(f"cli_loop_gpus: {args.nodes * args.gpus}")
    print(f"cli_loop_span_s: {last - first:.2f}")
    print(f"cli_loop_submit_s: {submitted - first:.2f}")
    print(f"cli_loop_drain_s: {max(0.0, last - submitted):.2f}")
    print(f"cli_loop_gsubmit_median_ms: {statistics.median(took_ms):.1f}")
    print(f"cli_loop_gsubmit_p90_ms: {took_ms[int(len(took_ms) * 0.9)]:.1f}")
    print(f"cli_loop_jobs_per_s: {args.jobs / (last - first):.1f}")
    print(f"cli_loop_python_bare_ms: {bare:.1f}")
    per_job = 1000 / args.jobs
    print(f"cli_loop_cpu_ms_per_job_gsubmit: {gsubmit_cpu * per_job:.2f}")
    for name in ("controller", "agent", "postgres"):
        used = daemons_after[name] - daemons_before[name]
        print(f"cli_loop_cpu_ms_per_job_{name}: {used * per_job:.2f}")
    share = (busy_after - busy_before) / ((waited - first) * (os.cpu_count() or 1))
    print(f"cli_loop_cpu_busy_share: {share:.2f}")


if __name__ == "__main__":
    main()
