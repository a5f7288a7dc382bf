"""A differential property test of GPU-hour budgets: for random account trees, budgets,
running jobs and queues, the decisions of the pass (and of its LimitTracker alone)
equal those of a deliberately simple recomputation, which sums everything again from
scratch for every job; and no plan ever commits a budget past its GPU-hours."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.budgets import Budget, BudgetBook
from gpusched.core.fairshare import Account
from gpusched.core.limits import LimitTracker
from gpusched.core.model import (
    GpuView,
    NodeState,
    NodeView,
    PartitionView,
    PendingJob,
    Policy,
    Reason,
    RunningJob,
    Snapshot,
)
from gpusched.core.plan import plan, queue_order

NOW = 1_800_000_000.0
HOUR = 3600
ACCOUNTS = ("a0", "a1", "a2", "a3", "a4")
USERS = ("u0", "u1", "u2")


@dataclass(frozen=True)
class World:
    parents: dict[str, str]
    budgets: tuple[Budget, ...]
    running: tuple[RunningJob, ...]
    pending: tuple[PendingJob, ...]


@st.composite
def worlds(draw: st.DrawFn) -> World:
    # Account i's parent is root or an account before it: always a tree.
    parents = {name: draw(st.sampled_from(("root", *ACCOUNTS[:i])))
               for i, name in enumerate(ACCOUNTS)}
    keys = draw(st.lists(st.tuples(st.sampled_from(ACCOUNTS), st.sampled_from((None, *USERS))),
                         max_size=6, unique=True))
    budgets = tuple(Budget(account, user, draw(st.integers(0, 40)), "month",
                           draw(st.integers(0, 30)) * HOUR, NOW) for account, user in keys)
    running = tuple(
        RunningJob(100 + i, "n", tuple(f"r{i}-{g}" for g in range(draw(st.integers(1, 3)))),
                   user=draw(st.sampled_from(USERS)),
                   account=draw(st.sampled_from((None, *ACCOUNTS))),
                   end_time=draw(st.one_of(st.none(), st.integers(-2, 6).map(
                       lambda h: NOW + h * HOUR))))
        for i in range(draw(st.integers(0, 5))))
    pending = tuple(
        PendingJob(1 + i, "gpu", draw(st.integers(1, 4)), 1000, float(draw(st.integers(0, 50))),
                   time_limit=draw(st.one_of(st.none(), st.integers(1, 8).map(lambda h: h * HOUR))),
                   user=draw(st.sampled_from(USERS)),
                   account=draw(st.sampled_from((None, *ACCOUNTS))))
        for i in range(draw(st.integers(1, 12))))
    return World(parents, budgets, running, pending)


def _in_scope(budget: Budget, user: str, account: str | None, parents: dict[str, str]) -> bool:
    """Whether ``budget`` covers a job: written apart from the core, on purpose."""
    if account is None:
        return False
    if budget.user is not None:
        return budget.account == account and budget.user == user
    chain = [account]
    while chain[-1] in parents:
        chain.append(parents[chain[-1]])
    return budget.account in chain


def running_commitment(world: World, budget: Budget) -> float:
    """What the budget's period used and its running jobs may still use, afresh."""
    total = budget.used_s
    for run in world.running:
        if _in_scope(budget, run.user, run.account, world.parents) and run.end_time:
            total += len(run.gpu_uuids) * max(0.0, run.end_time - NOW)
    return total


def reference(world: World, order: list[PendingJob]) -> list[bool]:
    """For each job in ``order``: whether it may start, recomputing every sum afresh."""
    admitted: list[PendingJob] = []
    decisions = []
    for job in order:
        fits = True
        for budget in world.budgets:
            if not _in_scope(budget, job.user, job.account, world.parents):
                continue
            total = running_commitment(world, budget)
            for other in admitted:
                if _in_scope(budget, other.user, other.account, world.parents):
                    total += other.gpus * (other.time_limit or math.inf)
            total += job.gpus * (job.time_limit if job.time_limit is not None else math.inf)
            if total > budget.gpu_hours * HOUR:
                fits = False
        decisions.append(fits)
        if fits:
            admitted.append(job)
    return decisions


def _tree(world: World) -> tuple[Account, ...]:
    return tuple(Account(name, parent) for name, parent in world.parents.items())


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_the_tracker_decides_as_the_simple_recomputation(world: World) -> None:
    book = BudgetBook(world.budgets, _tree(world), world.running)
    assert book.committed == {b.key: running_commitment(world, b) for b in world.budgets}
    tracker = LimitTracker({}, world.running, book if world.budgets else None)
    decided = []
    for job in world.pending:
        fits = tracker.blocking(job) is None
        assert book.fits(job) == (not book.over(job)) == fits  # the pass's quick check
        decided.append(fits)
        if fits:
            tracker.started(job)
    assert decided == reference(world, list(world.pending))


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_the_pass_starts_exactly_the_jobs_the_recomputation_admits(world: World) -> None:
    # One node with room for every job besides the running ones' GPUs: only budgets can
    # hold a job back.
    room = sum(job.gpus for job in world.pending)
    held = [uuid for run in world.running for uuid in run.gpu_uuids]
    nodes = (NodeView("n", NodeState.UP, tuple(
        GpuView(uuid, i) for i, uuid in enumerate([*(f"g{i}" for i in range(room)), *held]))),)
    snapshot = Snapshot(nodes, (PartitionView("gpu", ("n",)),), world.pending, world.running,
                        accounts=_tree(world), budgets=world.budgets)
    policy = Policy()
    order = queue_order(snapshot, NOW, policy)
    result = plan(snapshot, NOW, policy)
    expected = reference(world, order)
    started = {s.job_id for s in result.starts}
    assert started == {job.job_id for job, fits in zip(order, expected) if fits}
    assert {p.job_id: p.reason for p in result.pending} == {
        job.job_id: Reason.ASSOC_GRP_GRES_MINUTES for job, fits in zip(order, expected)
        if not fits}
    for budget in world.budgets:
        committed = running_commitment(world, budget)
        spent = sum(job.gpus * (job.time_limit or math.inf) for job in order
                    if job.job_id in started
                    and _in_scope(budget, job.user, job.account, world.parents))
        assert spent == 0 or committed + spent <= budget.gpu_hours * HOUR
