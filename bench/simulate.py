"""Replay a whole trace through ``gpusched simulate``'s engine; prints ``name: value`` lines.

    .venv/bin/python bench/simulate.py [--trace FILE] [--nodes 30] [--gpus-per-node 8]
                                       [--backfill easy] [--policy fcfs] [--limit N]

By default the full HPC2N log (202,871 jobs; ``../shared/traces`` beside the repository)
on 240 GPUs (30 nodes of 8) with first-come-first-served EASY backfill.
``sim_jobs_per_s`` counts replayed jobs over the replay's wall time; ``total_s``
adds reading the trace.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpusched.sim.cluster import uniform  # noqa: E402
from gpusched.sim.metrics import metrics  # noqa: E402
from gpusched.sim.replay import SimPolicy, simulate  # noqa: E402
from gpusched.sim.traces import read_trace  # noqa: E402

HPC2N = ROOT.parent / "shared" / "traces" / "HPC2N-2002-2.2-cln.swf.gz"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=HPC2N)
    parser.add_argument("--nodes", type=int, default=30)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--backfill", default="easy")
    parser.add_argument("--policy", default="fcfs")
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    began = time.perf_counter()
    trace = read_trace(args.trace).window(0, args.limit)
    read_s = time.perf_counter() - began
    result = simulate(trace.jobs, uniform(args.nodes, args.gpus_per_node),
                      SimPolicy(args.policy, args.backfill))
    total = time.perf_counter() - began
    figures = metrics(result.records, result.cluster_gpus)
    print(f"trace: {args.trace.name}")
    print(f"cluster_gpus: {result.cluster_gpus}")
    print(f"policy: {result.policy.name}")
    print(f"jobs: {len(result.records)}")
    print(f"passes: {result.passes}")
    print(f"read_s: {read_s:.2f}")
    print(f"sim_s: {result.wall_s:.2f}")
    print(f"total_s: {total:.2f}")
    print(f"sim_jobs_per_s: {len(result.records) / result.wall_s:.0f}")
    print(f"avg_wait_s: {figures['avg_wait_s']:.1f}")
    print(f"utilization: {figures['utilization']:.4f}")


if __name__ == "__main__":
    main()
