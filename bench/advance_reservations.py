"""What advance reservations cost a scheduling pass; prints ``name: value`` lines.

    .venv/bin/python bench/advance_reservations.py [--nodes 1000] [--pending 20000]
                                                   [--running 5000] [--repeat 5]
                                                   [--maint 10] [--inside 500]

bench/sched_pass.py's cluster and queue, planned three ways on the same snapshot:
without reservations (``plain_ms``); with ``--maint`` whole-node maintenance
reservations of 2% of the nodes each, starting in one to ten hours (``maint_ms``); and
with those plus one active GPU-count reservation of 64 GPUs whose ``--inside`` pending
jobs (taken from the queue) run in it (``inside_ms``). Each is the median of
``--repeat`` passes of ``core.plan.plan`` (EASY backfill, 100 reservations); the
``*_cpu_ms`` lines are the process's CPU time per pass, steadier on a busy machine.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.sched_pass import NOW, standard_snapshot  # noqa: E402
from gpusched.core.model import Policy, Reason, Snapshot  # noqa: E402
from gpusched.core.plan import plan  # noqa: E402
from gpusched.core.reservations import AdvanceReservation  # noqa: E402

HOUR = 3600.0


def timed(snapshot: Snapshot, policy: Policy, repeat: int) -> tuple[float, float, object]:
    """The median wall and CPU milliseconds of ``repeat`` passes, and the last plan."""
    times, cpu, result = [], [], None
    for _ in range(repeat):
        started, used = time.perf_counter(), time.process_time()
        result = plan(snapshot, NOW, policy)
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - used)
    return statistics.median(times) * 1000, statistics.median(cpu) * 1000, result


def main() -> None:
    """Build the cluster and queue, then time passes without and with reservations."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=20_000)
    parser.add_argument("--running", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--maint", type=int, default=10)
    parser.add_argument("--inside", type=int, default=500)
    opts = parser.parse_args()
    rng = random.Random(11)
    snapshot = standard_snapshot(opts.nodes, opts.pending, opts.running, rng)
    pending = snapshot.pending
    names = [n.name for n in snapshot.nodes]
    users = sorted({(j.user, j.account) for j in pending})
    policy = Policy(backfill="easy", reservations=100)
    share = max(1, len(names) // 50)
    maint = tuple(
        AdvanceReservation(f"maint{i}", NOW + (1 + i % 10) * HOUR, NOW + (3 + i % 10) * HOUR,
                           tuple((n, 0) for n in rng.sample(names, share)), ("root",), (),
                           frozenset({"MAINT"}))
        for i in range(opts.maint))
    team = AdvanceReservation("team", NOW - HOUR, NOW + 8 * HOUR,
                              tuple((n, 8) for n in rng.sample(names, 8)),
                              tuple(sorted({u for u, _ in users})))
    inside = {j.job_id for j in rng.sample(pending, opts.inside)}
    with_team = replace(snapshot, pending=tuple(
        replace(j, reservation="team") if j.job_id in inside else j for j in pending),
        advance_reservations=(*maint, team))
    plain_ms, plain_cpu, _ = timed(snapshot, policy, opts.repeat)
    maint_ms, maint_cpu, held = timed(replace(snapshot, advance_reservations=maint), policy,
                                      opts.repeat)
    inside_ms, inside_cpu, mixed = timed(with_team, policy, opts.repeat)
    print(f"nodes: {opts.nodes}")
    print(f"pending_jobs: {opts.pending}")
    print(f"running_jobs: {opts.running}")
    print(f"maint_reservations: {opts.maint}")
    print(f"jobs_in_reservation: {opts.inside}")
    print(f"plain_ms: {plain_ms:.1f}")
    print(f"maint_ms: {maint_ms:.1f}")
    print(f"inside_ms: {inside_ms:.1f}")
    print(f"plain_cpu_ms: {plain_cpu:.1f}")
    print(f"maint_cpu_ms: {maint_cpu:.1f}")
    print(f"inside_cpu_ms: {inside_cpu:.1f}")
    print(f"maint_req_node_not_avail: "
          f"{sum(p.reason is Reason.REQ_NODE_NOT_AVAIL for p in held.pending)}")  # type: ignore[attr-defined]
    print(f"inside_starts: "
          f"{sum(s.job_id in inside for s in mixed.starts)}")  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
