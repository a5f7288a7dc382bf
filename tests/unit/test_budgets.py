"""GPU-hour budgets in the core: periods in UTC, what a budget covers, what running jobs
commit, and the pass: a job over budget waits with AssocGrpGRESMinutes, the rest are
unaffected, backfill never starts one, explain says what is left."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from gpusched.core.budgets import (
    Budget,
    BudgetBook,
    covered_accounts,
    period_after,
    period_start,
    periods_between,
)
from gpusched.core.explain import explain
from gpusched.core.fairshare import Account
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
from gpusched.core.plan import plan

NOW = datetime(2026, 11, 28, 4, 0, tzinfo=UTC).timestamp()
HOUR = 3600
TREE = (Account("physics", "root"), Account("theory", "physics"), Account("chem", "root"))


def at(*parts: int) -> float:
    return datetime(*parts, tzinfo=UTC).timestamp()  # type: ignore[arg-type]


def node(name: str, gpus: int) -> NodeView:
    return NodeView(name, NodeState.UP, tuple(GpuView(f"{name}-{i}", i) for i in range(gpus)))


def job(job_id: int, gpus: int, hours: float | None, account: str = "physics",
        user: str = "alice", **fields: object) -> PendingJob:
    limit = None if hours is None else int(hours * HOUR)
    return PendingJob(job_id, "gpu", gpus, 1000, float(job_id), time_limit=limit, user=user,
                      account=account, **fields)  # type: ignore[arg-type]


def snapshot(jobs: list[PendingJob], budgets: tuple[Budget, ...],
             running: tuple[RunningJob, ...] = (), gpus: int = 8) -> Snapshot:
    return Snapshot((node("a", gpus),), (PartitionView("gpu", ("a",)),), tuple(jobs), running,
                    accounts=TREE, budgets=budgets)


def decide(snap: Snapshot, policy: Policy = Policy()) -> tuple[list[int], dict[int, Reason]]:
    result = plan(snap, NOW, policy)
    return sorted(s.job_id for s in result.starts), {p.job_id: p.reason for p in result.pending}


def budget(account: str, hours: float, used_hours: float = 0.0, user: str | None = None,
           period: str = "month") -> Budget:
    return Budget(account, user, hours, period, used_hours * HOUR, NOW)


def test_periods_begin_at_their_utc_boundaries() -> None:
    now = at(2026, 11, 28, 4, 0)
    assert period_start("none", now) is None
    assert period_start("month", now) == at(2026, 11, 1)
    assert period_start("quarter", now) == at(2026, 10, 1)
    assert period_start("year", now) == at(2026, 1, 1)
    assert period_start("month", at(2026, 12, 1)) == at(2026, 12, 1)  # on the boundary
    assert period_start("quarter", at(2026, 3, 31, 23, 59)) == at(2026, 1, 1)
    assert period_after("month", at(2026, 12, 1)) == at(2027, 1, 1)
    assert period_after("quarter", at(2026, 10, 1)) == at(2027, 1, 1)
    assert period_after("year", at(2026, 1, 1)) == at(2027, 1, 1)
    assert periods_between("month", at(2026, 10, 15), at(2026, 12, 2)) == [
        (at(2026, 10, 1), at(2026, 11, 1)), (at(2026, 11, 1), at(2026, 12, 1)),
        (at(2026, 12, 1), at(2027, 1, 1))]
    assert periods_between("none", 0.0, now) == [(None, None)]
    assert periods_between("month", at(2000, 1, 1), now, most=3)[0] == (
        at(2026, 9, 1), at(2026, 10, 1))


def test_an_account_budget_covers_its_sub_accounts_and_a_users_only_that_user() -> None:
    parents = {a.name: a.parent for a in TREE}
    assert covered_accounts([("physics", None)], parents) == {"physics", "theory"}
    assert covered_accounts([("chem", "bob")], parents) == {"chem"}
    assert covered_accounts([("theory", None)], parents) == {"theory"}
    book = BudgetBook([budget("physics", 10), budget("theory", 5, user="alice")], TREE, ())
    assert book.scope("alice", "theory") == (("theory", "alice"), ("physics", None))
    assert book.scope("bob", "theory") == (("physics", None),)
    assert book.scope("alice", "chem") == ()


def test_running_jobs_commit_what_they_may_still_use_up_to_their_time_limits() -> None:
    running = (
        RunningJob(1, "a", ("a-0", "a-1"), user="alice", account="theory", end_time=NOW + 2 * HOUR),
        RunningJob(2, "a", ("a-2",), user="bob", account="chem", end_time=NOW + 9 * HOUR),
        RunningJob(3, "a", ("a-3",), user="alice", account="physics", end_time=NOW - 60),
        RunningJob(4, "a", ("a-4",), user="alice", account="physics", end_time=None),
    )
    book = BudgetBook([budget("physics", 10, used_hours=1.5)], TREE, running)
    used, committed, left = book.balance(("physics", None))
    assert (used, committed, left) == (1.5 * HOUR, 4 * HOUR, 4.5 * HOUR)


def test_a_share_counts_as_its_fraction_of_the_gpu() -> None:
    shared = NodeView("a", NodeState.UP, (GpuView("a-0", 0, sharing="mps", shares=100),))
    running = (RunningJob(1, "a", (), user="alice", account="physics", end_time=NOW + 4 * HOUR,
                          shares=(("a-0", 25, 0),)),)
    part = PartitionView("gpu", ("a",), sharing="mps", shares=100)
    book = BudgetBook([budget("physics", 10)], TREE, running, (shared,), (part,))
    assert book.balance(("physics", None))[1] == 1 * HOUR
    asking = job(5, 1, 8, share=50, share_mode="mps")
    assert book.states(asking)[0].job_s == 4 * HOUR


def test_a_job_over_budget_waits_and_the_others_start() -> None:
    jobs = [job(1, 4, 2), job(2, 1, 1), job(3, 4, 4, account="chem", user="bob")]
    started, reasons = decide(snapshot(jobs, (budget("physics", 8, used_hours=2),)))
    # physics: 2 used; job 1 would bring it to 10 > 8; job 2 to 3; chem has no budget.
    assert started == [2, 3] and reasons == {1: Reason.ASSOC_GRP_GRES_MINUTES}


def test_the_pass_counts_what_it_started_and_a_sub_accounts_jobs() -> None:
    jobs = [job(1, 2, 2, account="theory"), job(2, 2, 2), job(3, 1, 1)]
    started, reasons = decide(snapshot(jobs, (budget("physics", 5),)))
    assert started == [1, 3] and reasons == {2: Reason.ASSOC_GRP_GRES_MINUTES}


def test_a_users_budget_holds_only_that_users_jobs() -> None:
    jobs = [job(1, 2, 2), job(2, 2, 2, user="bob")]
    started, reasons = decide(snapshot(jobs, (budget("physics", 3, user="alice"),)))
    assert started == [2] and reasons == {1: Reason.ASSOC_GRP_GRES_MINUTES}


def test_a_job_without_a_time_limit_never_fits_a_budget() -> None:
    started, reasons = decide(snapshot([job(1, 1, None), job(2, 1, None, account="chem")],
                                       (budget("physics", 1e9),)))
    assert started == [2] and reasons == {1: Reason.ASSOC_GRP_GRES_MINUTES}


def test_exactly_what_is_left_fits() -> None:
    started, _ = decide(snapshot([job(1, 2, 1.5)], (budget("physics", 4, used_hours=1),)))
    assert started == [1]


def test_array_tasks_start_until_the_budget_is_spent() -> None:
    array = job(1, 1, 1, array_job_id=1, array_tasks="0-9")
    result = plan(snapshot([array], (budget("physics", 3),)), NOW, Policy())
    assert [s.array_task_id for s in result.starts] == [0, 1, 2]
    assert [p.reason for p in result.pending] == [Reason.ASSOC_GRP_GRES_MINUTES]


@pytest.mark.parametrize("backfill", ["easy", "conservative"])
def test_backfill_never_starts_a_job_a_budget_forbids(backfill: str) -> None:
    # Job 1 (no budget) waits for the whole node; job 2 of physics would fit by backfill
    # (it ends before the reservation) but its budget has too little left; job 3 fits both.
    running = (RunningJob(9, "a", ("a-0",), user="carol", account="chem", end_time=NOW + 5 * HOUR),)
    jobs = [job(1, 8, 1, account="chem", user="carol"), job(2, 2, 2), job(3, 1, 2)]
    started, reasons = decide(snapshot(jobs, (budget("physics", 3),), running),
                              Policy(backfill=backfill))
    assert started == [3]
    assert reasons[2] == Reason.ASSOC_GRP_GRES_MINUTES and reasons[1] == Reason.RESOURCES


def test_jobs_within_budget_get_the_plan_they_would_without_budgets() -> None:
    jobs = [job(i, 1 + i % 3, 1 + i % 5, account=("physics", "theory", "chem")[i % 3])
            for i in range(1, 12)]
    running = (RunningJob(50, "a", ("a-0",), user="x", account="theory", end_time=NOW + HOUR),)
    without = plan(snapshot(jobs, (), running), NOW, Policy())
    within = plan(snapshot(jobs, (budget("physics", 1000), budget("chem", 500, user="alice")),
                           running), NOW, Policy())
    assert within == without


def test_explain_says_what_is_left_and_what_time_limit_would_fit() -> None:
    snap = snapshot([job(1, 4, 2)], (budget("physics", 8, used_hours=2),))
    why = explain(snap, NOW, Policy(), 1)
    assert why.reason is Reason.ASSOC_GRP_GRES_MINUTES
    detail = why.blockers[0].detail
    assert why.blockers[0].reason is Reason.ASSOC_GRP_GRES_MINUTES
    assert "account physics has 6.00 of its 8 GPU-hours left this month" in detail
    assert "may use up to 8.00 GPU-hours" in detail
    assert "time limit <= 1:30:00" in detail


def test_explain_of_a_job_without_a_time_limit() -> None:
    snap = snapshot([job(1, 1, None, account="theory")], (budget("physics", 8, period="none"),))
    detail = explain(snap, NOW, Policy(), 1).blockers[0].detail
    assert "has no time limit" in detail and "left this" not in detail
    assert "it would start now with a time limit <= 8:00:00" in detail


def test_an_exclusive_job_counts_every_gpu_of_a_node() -> None:
    book = BudgetBook([budget("physics", 100)], TREE, (), (node("a", 8),))
    assert book.gpus(replace(job(1, 2, 1), exclusive=True)) == 8
    assert book.gpus(job(1, 2, 1, nodes=3)) == 6
