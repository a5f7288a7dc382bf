"""Allocation latency on an idle cluster; prints ``name: value`` lines.

    .venv/bin/python bench/allocation_start.py [--nodes 2] [--runs 15]

Starts its own cluster (``gpusched up --nodes N`` under a temporary XDG_STATE_HOME),
then RUNS + 1 times (the first a warm-up, not counted) each of:

- galloc_ms: ``galloc -N N --gpus-per-node 1 true``, from its start to its exit: the
  submission, the pass that starts it, the wait for it, ``true`` run here and the
  completion (the GPUs free again when it exits);
- galloc_granted_ms: from galloc's start to its command running (``date +%s.%N`` as the
  command);
- gsrun_outside_ms: ``gsrun -N N true`` outside a job, start to exit: the allocation,
  one step of a task per node, and the allocation's end;
- gsrun_in_alloc_ms: for scale, the same step by ``gsrun`` inside one galloc (the
  allocation made once), start to exit.

Figures: median and 90th percentile in milliseconds, and the machine's load.
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


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def timed(env: dict[str, str], cwd: Path, *args: str) -> tuple[float, str]:
    """Seconds from the start to the exit of ``args``, and its stdout."""
    began = time.time()
    result = subprocess.run([str(BIN / args[0]), *args[1:]], env=env, cwd=cwd,
                            capture_output=True, text=True, timeout=120)
    took = time.time() - began
    if result.returncode != 0:
        raise SystemExit(f"{args}: exit {result.returncode}: {result.stderr}")
    return took, result.stdout if args[0] != "galloc" else f"{began} {result.stdout}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--runs", type=int, default=15)
    options = parser.parse_args()
    nodes, runs = options.nodes, options.runs
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="gpusched-allocstart-"))
    os.chmod(root, 0o755)
    env = {**os.environ, "XDG_STATE_HOME": str(root)}
    for name in ("GPUSCHED_SOCKET", "GPUSCHED_CONTROLLERS", "GPUSCHED_CONFIG",
                 "SLURM_JOB_ID", "GPUSCHED_JOB_ID"):
        env.pop(name, None)
    figures: dict[str, list[float]] = {"galloc_ms": [], "galloc_granted_ms": [],
                                       "gsrun_outside_ms": [], "gsrun_in_alloc_ms": []}
    try:
        up = subprocess.run([str(BIN / "gpusched"), "up", "--nodes", str(nodes), "--gpus", "2"],
                            env=env, cwd=root, capture_output=True, text=True, timeout=300)
        if up.returncode != 0:
            raise SystemExit(up.stdout + up.stderr)
        shape = ("-N", str(nodes), "--gpus-per-node", "1")
        for run in range(runs + 1):
            took, out = timed(env, root, "galloc", *shape, "date", "+%s.%N")
            began, ran = (float(x) for x in out.split())
            took_plain, _ = timed(env, root, "galloc", *shape, "true")
            outside, _ = timed(env, root, "gsrun", "-N", str(nodes), "true")
            if run:
                figures["galloc_ms"].append(took_plain * 1000)
                figures["galloc_granted_ms"].append((ran - began) * 1000)
                figures["gsrun_outside_ms"].append(outside * 1000)
        loop = (f"for i in $(seq {runs + 1}); do t0=$(date +%s.%N); {BIN}/gsrun -N {nodes} true; "
                "t1=$(date +%s.%N); echo $t0 $t1; done")
        _, out = timed(env, root, "galloc", *shape, "sh", "-c", loop)
        pairs = [line.split() for line in out.split(" ", 1)[1].splitlines()]
        figures["gsrun_in_alloc_ms"] = [(float(b) - float(a)) * 1000 for a, b in pairs[1:]]
    finally:
        subprocess.run([str(BIN / "gpusched"), "down"], env=env, cwd=root,
                       capture_output=True, timeout=120)
        shutil.rmtree(root, ignore_errors=True)
    print(f"nodes: {nodes}")
    print(f"runs: {runs}")
    for name, values in figures.items():
        print(f"{name}_median: {statistics.median(values):.1f}")
        print(f"{name}_p90: {percentile(values, 0.9):.1f}")
    print(f"load_1min: {os.getloadavg()[0]:.2f}")
    print(f"cpus: {os.cpu_count()}")


if __name__ == "__main__":
    main()
