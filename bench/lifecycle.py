"""Lifecycle figures on a fresh local cluster; prints ``name: value`` lines.

    .venv/bin/python bench/lifecycle.py [--jobs 1000] [--gpus 8] [--trials 30] [--no-stages]
                                        [--tmp /tmp]

Starts its own cluster (``gpusched up`` under a temporary XDG_STATE_HOME) and stops it.
Its daemons run with ``GPUSCHED_LOG_STAGES=1`` (gpusched/stages.py), unless
``--no-stages``: submit → start is then split by stage (``stage_*`` lines: the client's
call to the row committed, to the pass woken, the pass, its launch order sent to the
agent and received there, the supervisor spawned, the job forked, its first
instruction), and the drain too (``drain_*``: passes per second, jobs started per pass,
and each stage from a job's start to its end and from its end to the next pass; and
how the agent launches a work answer's jobs in turn: ``drain_launch_*``).
The drain also reports the CPU each daemon spent per job (``drain_cpu_ms_per_job_*``:
the controller, the agent with its supervisors and jobs, PostgreSQL), each with every
process under it, the ended ones included once their parent has reaped them; and the
agent's part split (``drain_cpu_ms_per_job_agent_*``): the agent process itself (with
anything it ran directly), its supervisor spawners, the job supervisors they forked,
and the jobs (what their cgroups counted: from the job's process joining its cgroup,
just after its fork, so its way to exec included; on a node that confines no job,
supervisors and jobs are one figure, ``..._supervisors_and_jobs``).
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
from datetime import datetime
from pathlib import Path

import stage_report
from daemon_cpu import cpu_of_trees

BIN = Path(sys.executable).parent


def _client():  # type: ignore[no-untyped-def]
    from gpusched.client import ApiClient

    return ApiClient()


def submit(client, script: str, work: Path, gpus: int = 1,  # type: ignore[no-untyped-def]
           name: str = "bench") -> int:
    """Submit through the API, as gsubmit does."""
    return client.request("POST", "/v1/jobs", {
        "script": script, "name": name, "gpus": gpus, "work_dir": str(work),
        "environment": {"PATH": os.environ["PATH"]}, "output": "/dev/null",
    })["job_id"]


def wait_done(client, ids: list[int], timeout: float, interval: float = 0.01,  # type: ignore[no-untyped-def]
              name: str | None = None) -> list[dict]:
    """Wait until every job in ``ids`` has ended (with ``name``: every active job of
    that name, when those are all of ``ids``); returns their JOB objects.

    Polls only the ids of the active ones, so the watching itself costs the controller
    and its database little (whole JOB objects of a thousand jobs cost them about as
    much as the jobs do, and so does a list of a thousand ids to look up).
    """
    deadline = time.monotonic() + timeout
    wanted = ",".join(map(str, ids))
    watch = f"name={name}" if name is not None else f"ids={wanted}"
    while client.request("GET", f"/v1/jobs?state=PENDING,RUNNING&{watch}"
                         "&fields=job_id")["rows"]:
        if time.monotonic() > deadline:
            raise SystemExit(f"jobs did not finish within {timeout}s")
        time.sleep(interval)
    return client.request("GET", f"/v1/jobs?all=1&ids={wanted}")["jobs"]


def wait_stamp(path: Path, timeout: float) -> float:
    """The time a job wrote to ``path`` (its first instruction), once it is there.

    Watched on the file system, not through the API, so that watching loads the
    controller with nothing.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = path.read_text()
            if text.endswith("\n"):
                return float(text)
        except FileNotFoundError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"no job wrote {path} within {timeout}s")
        time.sleep(0.001)


def submit_to_start(client, work: Path, trials: int  # type: ignore[no-untyped-def]
                    ) -> tuple[float, list[tuple[int, float, float]]]:
    """Median seconds from just before the submit request to the job's first
    instruction; and per trial the job id, the time before the call, and that of the
    first instruction."""
    latencies, seen = [], []
    for i in range(trials):
        stamp = work / f"start-{i}"
        script = f"#!/bin/sh\ndate +%s.%N > {stamp}\n"
        before = time.time()
        job_id = submit(client, script, work)
        first = wait_stamp(stamp, 30)
        wait_done(client, [job_id], 30, interval=0.02)
        latencies.append(first - before)
        seen.append((job_id, before, first))
    return statistics.median(latencies), seen


def throughput(client, work: Path, count: int  # type: ignore[no-untyped-def]
               ) -> tuple[float, float, list[int], float, float, float | None]:
    """Jobs per second from the first submit to the last completion, that span, the
    job ids, the first submit's and last end's times, and the CPU seconds the jobs'
    cgroups counted (None when a job was not confined)."""
    first = time.time()
    ids = [submit(client, "#!/bin/sh\ntrue\n", work, name="drain") for _ in range(count)]
    jobs = wait_done(client, ids, 600, interval=0.25, name="drain")
    failed = [j for j in jobs if j["state"] != "COMPLETED"]
    if failed:
        raise SystemExit(f"{len(failed)} jobs did not complete, e.g. {failed[0]}")
    last = max(datetime.fromisoformat(j["end_time"]).timestamp() for j in jobs)
    counted = [j.get("cpu_usec") for j in jobs]
    job_cpu = None if None in counted else sum(counted) / 1e6
    return count / (last - first), last - first, ids, first, last, job_cpu


def cpu_lines(before: dict[str, float], after: dict[str, float], job_cpu: float | None,
              jobs: int) -> list[str]:
    """``drain_cpu_ms_per_job_*`` lines: CPU milliseconds per job of each daemon, and
    of each part of the agent's (the jobs' part from what their cgroups counted)."""
    used = {name: (after[name] - before[name]) * 1000 / jobs for name in after}
    lines = [f"drain_cpu_ms_per_job_{name}: {used[name]:.2f}"
             for name in ("controller", "agent", "postgres", "agent_process",
                          "agent_spawner")]
    if job_cpu is None:
        lines.append(f"drain_cpu_ms_per_job_agent_supervisors_and_jobs: "
                     f"{used['agent_supervisors']:.2f}")
    else:
        jobs_ms = job_cpu * 1000 / jobs
        lines.append(f"drain_cpu_ms_per_job_agent_supervisors: "
                     f"{used['agent_supervisors'] - jobs_ms:.2f}")
        lines.append(f"drain_cpu_ms_per_job_agent_jobs: {jobs_ms:.2f}")
    return lines


def stage_lines(root: Path) -> stage_report.Stamps:
    """The stage lines the cluster's daemons logged so far."""
    logs = root / "state" / "gpusched" / "logs"
    return stage_report.read(sorted(logs.glob("*.log")))


def cli_wall(args: list[str], trials: int, work: Path) -> float:
    """Median wall seconds of one CLI invocation."""
    times = []
    for _ in range(trials):
        started = time.perf_counter()
        subprocess.run([str(BIN / args[0]), *args[1:]], check=True, cwd=work,
                       stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    """Run every figure on a fresh cluster."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--keep", action="store_true", help="keep the state dir and logs")
    parser.add_argument("--no-stages", action="store_true",
                        help="run the daemons without their stage log (no stage_* lines)")
    parser.add_argument("--only", choices=["latency", "throughput", "cli"], default=None)
    parser.add_argument("--tmp", default="/tmp", help=(
        "where the cluster's state dir is made. On ext4 without a journal every new file "
        "costs more while many were deleted in the last minute or more (by a previous "
        "run's cleanup, say): the figures then vary with what ran just before, less since "
        "a job's run reuses the directory of one that ended (gpusched/agent/sparedirs.py)"))
    opts = parser.parse_args()
    root = Path(tempfile.mkdtemp(dir=opts.tmp, prefix="gpusched-bench-"))
    os.chmod(root, 0o755)
    work = root / "work"
    work.mkdir()
    os.environ["XDG_STATE_HOME"] = str(root / "state")
    os.environ.pop("GPUSCHED_SOCKET", None)
    if opts.no_stages:
        os.environ.pop("GPUSCHED_LOG_STAGES", None)
    else:
        os.environ["GPUSCHED_LOG_STAGES"] = "1"
    run = [str(BIN / "gpusched")]
    subprocess.run([*run, "up", "--gpus", str(opts.gpus)], check=True, stdout=subprocess.DEVNULL)
    try:
        with _client() as client:
            if opts.only in (None, "latency"):
                latency, trials = submit_to_start(client, work, opts.trials)
                print(f"submit_to_start_median_ms: {latency * 1000:.1f}")
                if not opts.no_stages:
                    print(*stage_report.submit_to_start(stage_lines(root), trials), sep="\n")
            if opts.only in (None, "throughput"):
                before = cpu_of_trees(root)
                rate, span, ids, first, last, job_cpu = throughput(client, work, opts.jobs)
                after = cpu_of_trees(root)
                print(f"throughput_jobs: {opts.jobs}")
                print(f"throughput_span_s: {span:.2f}")
                print(f"throughput_jobs_per_s: {rate:.1f}")
                print(*cpu_lines(before, after, job_cpu, opts.jobs), sep="\n")
                if not opts.no_stages:
                    print(*stage_report.drain(stage_lines(root), ids, first, last), sep="\n")
        if opts.only in (None, "cli"):
            submit_ms = cli_wall(["gsubmit", "--wrap", "true"], opts.trials, work) * 1000
            print(f"gsubmit_wrap_true_median_ms: {submit_ms:.1f}")
            print(f"gqueue_median_ms: {cli_wall(['gqueue'], opts.trials, work) * 1000:.1f}")
    finally:
        subprocess.run([*run, "down"], check=False, stdout=subprocess.DEVNULL)
        if opts.keep:
            print(f"state_dir: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
