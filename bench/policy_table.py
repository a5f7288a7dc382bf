"""FCFS, EASY and conservative backfill replayed on the SWF logs; ``name: value`` lines
and, with ``--markdown``, the table of docs/simulate.md.

    .venv/bin/python bench/policy_table.py [--trace NAME ...] [--modes none,easy,conservative]
                                           [--limit N] [--skip N] [--no-kill] [--procs P]
                                           [--markdown]

Each log runs on the cluster it came from, as 1-GPU nodes (a processor is a GPU): the
header's ``MaxProcs`` nodes, or ``MaxNodes`` where there is no ``MaxProcs`` (the Lublin
logs). SDSC-BLUE runs as its 144 nodes of 8 (a processor is still a GPU) instead of
1,152 one-GPU nodes. ``CLUSTERS`` below holds these choices. Every log is replayed in
the same window, its first ``--limit`` jobs (5,000 by default; 0: the whole log) after
the first ``--skip``: conservative backfill on whole logs takes hours. The queue is
first come, first served; jobs end at their time limit unless ``--no-kill``.
Bounded slowdown uses a 10 s bound (``gpusched.sim.metrics``). Replays run in
``--procs`` processes side by side.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpusched.sim.cluster import uniform  # noqa: E402
from gpusched.sim.metrics import metrics  # noqa: E402
from gpusched.sim.replay import SimPolicy, simulate  # noqa: E402
from gpusched.sim.traces import read_trace  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces"
# log -> (nodes, GPUs per node)
CLUSTERS = {
    "CTC-SP2-1996-3.1-cln.swf.gz": (338, 1),
    "HPC2N-2002-2.2-cln.swf.gz": (240, 1),
    "KTH-SP2-1996-2.1-cln.swf.gz": (100, 1),
    "SDSC-BLUE-2000-4.2-cln.swf.gz": (144, 8),
    "SDSC-SP2-1998-4.2-cln.swf.gz": (128, 1),
    "lublin_256.swf.gz": (256, 1),
    "lublin_256_new2.swf.gz": (256, 1),
}
LABELS = {"none": "FCFS", "easy": "EASY", "conservative": "conservative"}


def replay(trace: str, mode: str, skip: int, limit: int | None, kill: bool
           ) -> dict[str, float | int | str]:
    """One replay's figures, with what was run."""
    nodes, per_node = CLUSTERS[trace]
    jobs = read_trace(TRACES / trace).window(skip, limit).jobs
    result = simulate(jobs, uniform(nodes, per_node), SimPolicy("fcfs", mode, kill=kill))
    figures: dict[str, float | int | str] = dict(metrics(result.records, result.cluster_gpus))
    figures.update(trace=trace, mode=mode, nodes=nodes, gpus_per_node=per_node, skip=skip,
                   limit=-1 if limit is None else limit, never=len(result.never),
                   sim_s=round(result.wall_s, 1))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", action="append", choices=sorted(CLUSTERS),
                        help="a log of ../shared/traces (default: every one)")
    parser.add_argument("--modes", default="none,easy,conservative")
    parser.add_argument("--limit", type=int, default=5000,
                        help="replay at most N jobs of every log (0: all)")
    parser.add_argument("--skip", type=int, default=0)
    parser.add_argument("--no-kill", action="store_true")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    traces = args.trace or sorted(CLUSTERS)
    modes = args.modes.split(",")
    bad = [m for m in modes if m not in LABELS]
    if bad:
        parser.error(f"unknown mode {bad[0]!r}; expected some of {', '.join(LABELS)}")
    began = time.perf_counter()
    runs = [(t, m, args.skip, args.limit or None, not args.no_kill)
            for t in traces for m in modes]
    slow_first = sorted(runs, key=lambda run: run[1] != "conservative")
    with ProcessPoolExecutor(max_workers=max(1, args.procs)) as pool:
        done = dict(zip(slow_first, pool.map(replay, *zip(*slow_first))))
    results = [done[run] for run in runs]
    for r in results:
        key = f"{Path(str(r['trace'])).name.split('.swf')[0]}.{r['mode']}"
        for name in ("jobs", "avg_wait_s", "avg_bounded_slowdown", "utilization", "sim_s"):
            value = r[name]
            print(f"{key}.{name}: {value:.4f}" if isinstance(value, float) else
                  f"{key}.{name}: {value}")
    print(f"total_s: {time.perf_counter() - began:.1f}")
    if args.markdown:
        print()
        print("| log | cluster | jobs | policy | avg wait (s) | avg bounded slowdown | "
              "utilisation |")
        print("|---|---|---|---|---|---|---|")
        for r in results:
            window = "all" if r["limit"] == -1 else f"first {r['limit']:,}"
            if r["skip"]:
                window += f" after {r['skip']:,}"
            print(f"| {str(r['trace']).split('.swf')[0]} | {r['nodes']} × {r['gpus_per_node']} "
                  f"| {r['jobs']:,} ({window}) | {LABELS[str(r['mode'])]} "
                  f"| {float(r['avg_wait_s']):,.0f} | {float(r['avg_bounded_slowdown']):.2f} "
                  f"| {float(r['utilization']):.3f} |")


if __name__ == "__main__":
    main()
