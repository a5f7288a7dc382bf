"""Replay a whole trace through ``gpusched simulate``'s engine; prints ``name: value`` lines.

    .venv/bin/python bench/simulate.py [--trace FILE] [--format swf|philly|alibaba]
                                       [--node-list FILE] [--nodes 30] [--gpus-per-node 8]
                                       [--backfill easy] [--policy fcfs] [--limit N]

By default the full HPC2N log (202,871 jobs; ``../shared/traces`` beside the repository)
on 240 GPUs (30 nodes of 8) with first-come-first-served EASY backfill. A trace that
brings its own node list (Alibaba) runs on that cluster unless ``--nodes`` is given:

    .venv/bin/python bench/simulate.py --trace ../shared/traces/alibaba_openb_pod_list_default.csv.gz

``sim_jobs_per_s`` counts replayed jobs over the replay's wall time; ``total_s``
adds reading the trace; ``sim_cpu_s`` is the replay's CPU time, which other work on a
busy machine disturbs less than the wall time. The scheduling figures and ``records_digest`` (a hash of every
job's start, end, nodes and GPUs) show that a faster replay decides the same.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpusched.sim.cluster import from_node_list, uniform  # noqa: E402
from gpusched.sim.metrics import metrics  # noqa: E402
from gpusched.sim.replay import JobRecord, SimPolicy, simulate  # noqa: E402
from gpusched.sim.traces import FORMATS, read_trace  # noqa: E402

HPC2N = ROOT.parent / "shared" / "traces" / "HPC2N-2002-2.2-cln.swf.gz"


def records_digest(records: list[JobRecord]) -> str:
    """A short hash of what happened to every job (records come sorted by job id)."""
    digest = hashlib.sha256()
    for r in records:
        digest.update(repr((r.job_id, r.start, r.end, r.state, r.nodes, r.gpu_uuids,
                            r.backfilled)).encode())
    return digest.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=HPC2N)
    parser.add_argument("--format", choices=FORMATS, default=None)
    parser.add_argument("--node-list", type=Path, default=None)
    parser.add_argument("--nodes", type=int, default=None,
                        help="default: the trace's own node list, else 30")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--backfill", default="easy")
    parser.add_argument("--policy", default="fcfs")
    parser.add_argument("--packing", default="bestfit", help="bestfit or fgd (shares of GPUs)")
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    began = time.perf_counter()
    trace = read_trace(args.trace, args.format, args.node_list).window(0, args.limit)
    read_s = time.perf_counter() - began
    cluster = (from_node_list(trace.nodes) if args.nodes is None and trace.nodes
               else uniform(args.nodes or 30, args.gpus_per_node))
    cpu_began = time.process_time()
    result = simulate(trace.jobs, cluster, SimPolicy(args.policy, args.backfill, packing=args.packing))
    cpu_s = time.process_time() - cpu_began
    total = time.perf_counter() - began
    figures = metrics(result.records, result.cluster_gpus)
    print(f"trace: {args.trace.name}")
    print(f"cluster: {cluster.describe()}")
    print(f"cluster_gpus: {result.cluster_gpus}")
    print(f"policy: {result.policy.name}")
    print(f"jobs: {len(result.records)}")
    print(f"passes: {result.passes}")
    print(f"read_s: {read_s:.2f}")
    print(f"sim_s: {result.wall_s:.2f}")
    print(f"sim_cpu_s: {cpu_s:.2f}")
    print(f"total_s: {total:.2f}")
    print(f"sim_jobs_per_s: {len(result.records) / result.wall_s:.0f}")
    print(f"avg_wait_s: {figures['avg_wait_s']:.3f}")
    print(f"avg_bounded_slowdown: {figures['avg_bounded_slowdown']:.4f}")
    print(f"utilization: {figures['utilization']:.6f}")
    print(f"records_digest: {records_digest(result.records)}")


if __name__ == "__main__":
    main()
