"""Per-job cgroup set-up and teardown time, cgroup v1 and v2 (root only).

Set-up: create the job's cgroup, apply a GPU device allow-list, a memory limit where
the controller exists, a cpuset (v1), and move a process in. Teardown: kill the (empty
or one-process) cgroup and remove it. Prints ``name: value`` lines.

    python bench/cgroups.py [--jobs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from gpusched.agent.cgroups import CgroupTree, JobCgroup, detect, gpu_device_rules


def _remove_tree(tree: CgroupTree) -> None:
    for path in [tree.root] if tree.version == 2 else list(tree.roots.values()):
        assert path is not None
        path.rmdir()


def measure(tree: CgroupTree, label: str, jobs: int) -> None:
    rules = gpu_device_rules([0, 1], {})
    cpus = set(os.sched_getaffinity(0))
    setup: list[float] = []
    teardown: list[float] = []
    for i in range(jobs):
        proc = subprocess.Popen(["sleep", "30"])
        t0 = time.perf_counter()
        job = JobCgroup.create(tree, f"bench-{i}")
        job.allow_devices(rules)
        if "memory" in tree.controllers():
            job.set_memory(1 << 30)
        if tree.version == 1:
            job.set_cpus(cpus)
        job.add(proc.pid)
        t1 = time.perf_counter()
        job.kill()
        job.remove()
        t2 = time.perf_counter()
        proc.wait()
        setup.append((t1 - t0) * 1000)
        teardown.append((t2 - t1) * 1000)
    for name, values in (("setup", setup), ("teardown", teardown)):
        print(f"{label}_{name}_ms_median: {statistics.median(values):.2f}")
        print(
            f"{label}_{name}_ms_p95: {sorted(values)[int(len(values) * 0.95) - 1]:.2f}"
        )
    print(f"{label}_jobs: {jobs}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    args = parser.parse_args()
    v1 = detect(name=f"gpusched-bench-{os.getpid()}")
    try:
        measure(v1, "v1", args.jobs)
    finally:
        _remove_tree(v1)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["mount", "-t", "cgroup2", "none", tmp], check=True)
        try:
            v2 = detect(Path(tmp) / f"gpusched-bench-{os.getpid()}")
            try:
                measure(v2, "v2", args.jobs)
            finally:
                _remove_tree(v2)
        finally:
            subprocess.run(["umount", tmp], check=True)


if __name__ == "__main__":
    main()
