"""Priority and fair-share for a large queue; prints ``name: value`` lines.

    .venv/bin/python bench/priority.py [--jobs 20000] [--users 500] [--repeat 7]

A 3-level account tree (root → 5 divisions → 10 accounts each → users), seeded random
usage, and pending jobs spread over the users. ``priority_ms`` is the median time of
``core.plan.job_priorities`` — what every pass runs: rank every user with Fair Tree and
compute every job's multifactor priority.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from gpusched.core.fairshare import Account, FairShareTree, UserShare
from gpusched.core.model import (
    GpuView,
    NodeState,
    NodeView,
    PartitionView,
    PendingJob,
    Policy,
    Snapshot,
)
from gpusched.core.plan import job_priorities


def build(jobs: int, users: int, seed: int = 7) -> tuple[FairShareTree, dict, list]:  # type: ignore[type-arg]
    """The tree, its usage and the pending jobs (without fair-share filled in)."""
    rng = random.Random(seed)
    accounts = [Account(f"div{d}", "root", rng.randint(1, 10)) for d in range(5)]
    accounts += [Account(f"acct{d}-{a}", f"div{d}", rng.randint(1, 10))
                 for d in range(5) for a in range(10)]
    leaves = [a.name for a in accounts if a.name.startswith("acct")]
    members = [UserShare(f"user{u}", leaves[u % len(leaves)], rng.randint(1, 3)) for u in range(users)]
    usage = {(m.user, m.account): rng.expovariate(1 / 50_000) for m in members}
    pending = [(i, rng.choice(members), rng.randint(1, 8), rng.uniform(0, 14 * 86400))
               for i in range(jobs)]
    return FairShareTree(accounts, members), usage, pending


def snapshot_of(tree: FairShareTree, usage: dict, pending: list, now: float) -> Snapshot:  # type: ignore[type-arg]
    """The queue as a pass sees it: 64 nodes of 8 GPUs, two partitions, two QOS."""
    nodes = tuple(NodeView(f"n{i:02d}", NodeState.UP,
                           tuple(GpuView(f"GPU-{i}-{g}", g) for g in range(8))) for i in range(64))
    names = tuple(n.name for n in nodes)
    return Snapshot(
        nodes=nodes, partitions=(PartitionView("gpu", names, tier=1), PartitionView("hi", names, tier=2)),
        pending=tuple(PendingJob(job_id, "gpu" if job_id % 5 else "hi", gpus, 1000, now - waited,
                                 user=m.user, account=m.account, qos="normal" if job_id % 3 else "low")
                      for job_id, m, gpus, waited in pending),
        accounts=tuple(a for a in tree.accounts.values() if a.name != "root"),
        user_shares=tuple(tree.users.values()), usage=usage, qos_priority={"normal": 100, "low": 10},
    )


def one_pass(snapshot: Snapshot, now: float) -> int:
    """Rank users with Fair Tree and every pending job by priority, as a pass does."""
    return job_priorities(snapshot, now, Policy())[0].job_id


def main() -> None:
    """Print the median over repeated passes."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=7)
    opts = parser.parse_args()
    tree, usage, pending = build(opts.jobs, opts.users)
    now = 14 * 86400.0
    snapshot = snapshot_of(tree, usage, pending, now)
    times = []
    for _ in range(opts.repeat):
        started = time.perf_counter()
        one_pass(snapshot, now)
        times.append(time.perf_counter() - started)
    print(f"pending_jobs: {opts.jobs}")
    print(f"users: {opts.users}")
    print(f"priority_ms: {statistics.median(times) * 1000:.1f}")
    started = time.perf_counter()
    tree.fair_tree(usage)
    print(f"fair_tree_ms: {(time.perf_counter() - started) * 1000:.2f}")


if __name__ == "__main__":
    main()
