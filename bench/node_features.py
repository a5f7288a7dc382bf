"""What -C/--constraint costs a scheduling pass; prints ``name: value`` lines.

    .venv/bin/python bench/node_features.py [--nodes 1000] [--pending 20000]
                                            [--running 5000] [--repeat 5]
                                            [--constrained 0.2]

bench/sched_pass.py's cluster and queue, planned twice on the same snapshot: as it is
(``plain_ms``), and with every node given rack, network and GPU features and a
fraction ``--constrained`` of the pending jobs a constraint (``constrained_ms``): a
third of them a plain feature or an and/or of two, a third a matching OR of racks, a
third a feature no node has (BadConstraints), multi-node jobs a count among them too.
Each is the median CPU time of ``--repeat`` passes of ``core.plan.plan`` (EASY backfill, 100
reservations).
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
from gpusched.core.features import canonical_constraint  # noqa: E402
from gpusched.core.model import Plan, Policy, Reason, Snapshot  # noqa: E402
from gpusched.core.plan import plan  # noqa: E402

SINGLE = ("h100", "a100&ib", "rack1|rack2", "(rack3|rack4)&ib", "sm_90")
MATCHING = ("[rack1|rack2]", "ib&[rack3|rack4|rack5]")
NEVER = ("v100", "rack1&rack2")


def timed(snapshot: Snapshot, policy: Policy, repeat: int) -> tuple[float, Plan]:
    """The median CPU milliseconds of ``repeat`` passes (CPU time: the machine may be
    busy), and the last plan."""
    times, result = [], None
    for _ in range(repeat):
        started = time.process_time()
        result = plan(snapshot, NOW, policy)
        times.append(time.process_time() - started)
    assert result is not None
    return statistics.median(times) * 1000, result


def main() -> None:
    """Build the cluster and queue, then time passes without and with constraints."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=20_000)
    parser.add_argument("--running", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--constrained", type=float, default=0.2)
    opts = parser.parse_args()
    rng = random.Random(17)
    snapshot = standard_snapshot(opts.nodes, opts.pending, opts.running, rng)
    nodes, pending = snapshot.nodes, snapshot.pending
    featured = tuple(replace(n, features=frozenset({
        f"rack{i % 8 + 1}", *(("ib",) if i % 2 else ()),
        *(("h100", "sm_90") if n.gpus[0].gpu_type.startswith("h100") else ("a100", "sm_80"))}))
        for i, n in enumerate(nodes))
    constrained = []
    for job in pending:
        if rng.random() >= opts.constrained:
            constrained.append(job)
            continue
        kind = rng.randrange(3)
        text = rng.choice((SINGLE, MATCHING, NEVER)[kind])
        if kind == 0 and job.nodes > 1 and rng.random() < 0.5:
            text = f"[ib*1&rack{rng.randrange(8) + 1}*1]"
        constrained.append(replace(job, constraint=canonical_constraint(text)))
    with_features = replace(snapshot, nodes=featured, pending=tuple(constrained))
    policy = Policy(backfill="easy", reservations=100)
    plain_ms, plain = timed(snapshot, policy, opts.repeat)
    constrained_ms, result = timed(with_features, policy, opts.repeat)
    asked = sum(j.constraint is not None for j in constrained)
    print(f"nodes: {opts.nodes}")
    print(f"pending_jobs: {opts.pending}")
    print(f"running_jobs: {opts.running}")
    print(f"constrained_jobs: {asked}")
    print(f"plain_ms: {plain_ms:.1f}")
    print(f"constrained_ms: {constrained_ms:.1f}")
    print(f"plain_starts: {len(plain.starts)}")
    print(f"constrained_starts: {len(result.starts)}")
    print(f"bad_constraints: "
          f"{sum(p.reason is Reason.BAD_CONSTRAINTS for p in result.pending)}")


if __name__ == "__main__":
    main()
