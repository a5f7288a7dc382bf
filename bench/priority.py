"""Priority and fair-share for a large queue; prints ``name: value`` lines.

    .venv/bin/python bench/priority.py [--jobs 20000] [--users 500] [--repeat 7]

A 3-level account tree (root → 5 divisions → 10 accounts each → users), seeded random
usage, and pending jobs spread over the users. ``priority_ms`` is the median time to
rank every user with Fair Tree and compute every job's multifactor priority.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from gpusched.core.fairshare import Account, FairShareTree, UserShare
from gpusched.core.priority import PriorityInput, PriorityScale, PriorityWeights, priorities


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


def one_pass(tree: FairShareTree, usage: dict, pending: list, now: float) -> int:  # type: ignore[type-arg]
    """Rank users and compute every job's priority; returns the top job id."""
    factors = tree.fair_tree(usage)
    inputs = [PriorityInput(job_id, now - waited, gpus, factors[(m.user, m.account)], 1, 10)
              for job_id, m, gpus, waited in pending]
    ranked = priorities(inputs, now, PriorityWeights(), PriorityScale(512, 2, 100))
    return ranked[0].job_id


def main() -> None:
    """Print the median over repeated passes."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=7)
    opts = parser.parse_args()
    tree, usage, pending = build(opts.jobs, opts.users)
    times = []
    for _ in range(opts.repeat):
        started = time.perf_counter()
        one_pass(tree, usage, pending, now=14 * 86400.0)
        times.append(time.perf_counter() - started)
    print(f"pending_jobs: {opts.jobs}")
    print(f"users: {opts.users}")
    print(f"priority_ms: {statistics.median(times) * 1000:.1f}")
    started = time.perf_counter()
    tree.fair_tree(usage)
    print(f"fair_tree_ms: {(time.perf_counter() - started) * 1000:.2f}")


if __name__ == "__main__":
    main()
