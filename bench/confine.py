"""Confinement's cost inside the real supervisor, launched through a real Launcher
(root only; cgroup v1 under /sys/fs/cgroup, and a cgroup2 mount for v2).

- launch latency: from ``Launcher.launch`` to the job's start (the supervisor's
  start_time, taken once the job's cgroup is made), one job at a time, unconfined and
  confined (device allow-list, memory limit where the controller exists, a cpuset of
  one CPU where the cpuset controller exists); the difference is the added latency;
- drain rate: N trivial jobs launched at once, until every end is read, jobs/s.

Prints ``name: value`` lines.

    python bench/confine.py [--latency-jobs N] [--drain-jobs N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from gpusched.agent.cgroups import CgroupTree, detect
from gpusched.agent.confine import Confinement, job_cgroup_spec
from gpusched.agent.launcher import Launcher, build_spec
from gpusched.messages import LaunchOrder

UUID = "GPU-11111111-2222-3333-4444-555555555555"
GPUS = {UUID: {"index": 0, "uuid": UUID, "minor": 0, "parent": None, "numa_node": None}}
SCRIPT = "#!/bin/sh\nexit 0\n"


def _order(job_id: int, work: Path) -> LaunchOrder:
    return LaunchOrder.parse({
        "job_id": job_id, "name": "bench", "user": "root", "uid": 0, "gid": 0,
        "script": SCRIPT, "args": [], "work_dir": str(work),
        "environment": {"PATH": "/usr/bin:/bin"}, "output": "/dev/null", "error": None,
        "time_limit": None, "gpu_uuids": [UUID], "node": "bench", "cpus": 1,
        "mem_mb": 512})


def _spec(launcher: Launcher, tree: CgroupTree | None, job_id: int, work: Path
          ) -> dict[str, Any]:
    order = _order(job_id, work)
    cgroup = None if tree is None else job_cgroup_spec(
        Confinement(tree, tree.describe()), order, GPUS, launcher.held_cpus())
    return build_spec(order, kill_grace=1.0, node_name="bench", min_uid=0, cgroup=cgroup)


def _wait(launcher: Launcher, pending: set[int]) -> dict[int, Any]:
    ends: dict[int, Any] = {}
    while pending:
        for end in launcher.wait_ended(timeout=1.0):
            if end.job_id in pending:
                pending.discard(end.job_id)
                ends[end.job_id] = end
                launcher.mark_reported(end.job_id)
    return ends


def latency(tree: CgroupTree | None, jobs: int) -> list[float]:
    """Milliseconds from launch to the job's start, one job at a time."""
    work = Path(tempfile.mkdtemp(prefix="gpusched-bench-"))
    launcher = Launcher(work / "jobs")
    out: list[float] = []
    try:
        for job_id in range(1, jobs + 1):
            spec = _spec(launcher, tree, job_id, work)
            t0 = time.time()
            launcher.launch(job_id, spec, SCRIPT)
            end = _wait(launcher, {job_id})[job_id]
            assert end.outcome == "completed", end
            out.append((end.start_time - t0) * 1000)
    finally:
        launcher.close()
        shutil.rmtree(work, ignore_errors=True)
    return out[5:]  # the first jobs start the spawner


def drain(tree: CgroupTree | None, jobs: int) -> float:
    """Jobs per second, N trivial jobs launched at once until every end is read."""
    work = Path(tempfile.mkdtemp(prefix="gpusched-bench-"))
    launcher = Launcher(work / "jobs")
    try:
        specs = {j: _spec(launcher, tree, j, work) for j in range(1, jobs + 1)}
        t0 = time.perf_counter()
        for job_id, spec in specs.items():
            launcher.launch(job_id, spec, SCRIPT)
        ends = _wait(launcher, set(specs))
        took = time.perf_counter() - t0
        bad = [e for e in ends.values() if e.outcome != "completed"]
        assert not bad, bad[:3]
        return jobs / took
    finally:
        launcher.close()
        shutil.rmtree(work, ignore_errors=True)


def _remove_tree(tree: CgroupTree) -> None:
    for path in [tree.root] if tree.version == 2 else list(tree.roots.values()):
        if path is not None:
            path.rmdir()


def report(label: str, tree: CgroupTree | None, args: argparse.Namespace,
           base_ms: float | None) -> float:
    values = latency(tree, args.latency_jobs)
    median = statistics.median(values)
    print(f"{label}_launch_to_start_ms_median: {median:.2f}")
    print(f"{label}_launch_to_start_ms_p95: {sorted(values)[int(len(values) * 0.95) - 1]:.2f}")
    if base_ms is not None:
        print(f"{label}_added_launch_latency_ms: {median - base_ms:.2f}")
    if args.drain_jobs:
        print(f"{label}_drain_jobs_per_s: {drain(tree, args.drain_jobs):.1f}")
    return median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-jobs", type=int, default=105)
    parser.add_argument("--drain-jobs", type=int, default=1000)
    args = parser.parse_args()
    print(f"cpus: {len(os.sched_getaffinity(0))}")
    print(f"drain_jobs: {args.drain_jobs}")
    base = report("unconfined", None, args, None)
    v1 = detect(name=f"gpusched-bench-{os.getpid()}")
    try:
        report("v1", v1, args, base)
    finally:
        _remove_tree(v1)
    with tempfile.TemporaryDirectory() as mnt:
        subprocess.run(["mount", "-t", "cgroup2", "none", mnt], check=True)
        try:
            v2 = detect(Path(mnt) / f"gpusched-bench-{os.getpid()}")
            try:
                report("v2", v2, args, base)
            finally:
                _remove_tree(v2)
        finally:
            subprocess.run(["umount", mnt], check=True)


if __name__ == "__main__":
    main()
