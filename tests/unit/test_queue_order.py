"""Queue order: highest priority total first, then earliest submitted, then lowest job id,
whether the ranking comes sorted (as a pass computes it) or in any other order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.model import PendingJob, Policy, Snapshot
from gpusched.core.plan import job_priorities, ordered
from gpusched.core.priority import (
    PriorityBreakdown,
    PriorityInput,
    PriorityScale,
    PriorityWeights,
    priorities,
)


def breakdown(job_id: int, total: float) -> PriorityBreakdown:
    return PriorityBreakdown(job_id, 0.0, 0.0, 0.0, 0.0, 0.0, total)


def expected(jobs: list[PendingJob], totals: dict[int, float]) -> list[int]:
    return [j.job_id for j in sorted(jobs, key=lambda j: (-totals[j.job_id], j.submit_time,
                                                          j.job_id))]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from((0.0, 0.25, 0.5, 0.75, 1.0)),
                          st.sampled_from((10.0, 20.0, 30.0))), min_size=1, max_size=40),
       st.booleans(), st.randoms())
def test_order_is_total_then_submit_time_then_id(rows: list[tuple[float, float]],
                                                 presorted: bool, rnd) -> None:
    jobs = [PendingJob(i + 1, "gpu", 1, 1000, submit) for i, (_, submit) in enumerate(rows)]
    rnd.shuffle(jobs)
    totals = {i + 1: total for i, (total, _) in enumerate(rows)}
    ranked = [breakdown(job_id, total) for job_id, total in totals.items()]
    if presorted:
        ranked.sort(key=lambda b: (-b.total, b.job_id))
    else:
        rnd.shuffle(ranked)
    snapshot = Snapshot(nodes=(), partitions=(), pending=tuple(jobs))
    assert [j.job_id for j in ordered(snapshot, ranked)] == expected(jobs, totals)


def test_equal_totals_go_by_submit_time_not_job_id() -> None:
    jobs = (PendingJob(1, "gpu", 1, 1000, 50.0), PendingJob(2, "gpu", 1, 1000, 40.0),
            PendingJob(3, "gpu", 1, 1000, 60.0), PendingJob(4, "gpu", 1, 1000, 10.0))
    ranked = [breakdown(4, 0.9), breakdown(1, 0.5), breakdown(2, 0.5), breakdown(3, 0.1)]
    order = ordered(Snapshot(nodes=(), partitions=(), pending=jobs), ranked)
    assert [j.job_id for j in order] == [4, 2, 1, 3]


def test_priorities_break_equal_totals_by_job_id() -> None:
    weights = PriorityWeights(age=0.0, fairshare=0.0, job_size=1.0, partition=0.0, qos=0.0)
    inputs = [PriorityInput(job_id, 0.0, gpus, 1.0) for job_id, gpus in
              ((5, 1), (3, 2), (9, 1), (1, 1), (7, 2))]
    ranked = priorities(inputs, 100.0, weights, PriorityScale(cluster_gpus=8))
    assert [b.job_id for b in ranked] == [3, 7, 1, 5, 9]


def test_a_held_job_has_priority_zero_and_its_factors_stay() -> None:
    weights = PriorityWeights(age=0.0, fairshare=1000.0, job_size=0.0, partition=0.0, qos=0.0)
    jobs = (PendingJob(1, "gpu", 2, 1000, 10.0), PendingJob(2, "gpu", 2, 1000, 20.0,
                                                            hold="user"),
            PendingJob(3, "gpu", 1, 1000, 30.0, hold="admin"))
    snapshot = Snapshot(nodes=(), partitions=(), pending=jobs)
    ranked = {b.job_id: b for b in job_priorities(snapshot, 100.0, Policy(weights=weights))}
    assert ranked[1].total > 0 and ranked[2].total == 0 and ranked[3].total == 0
    assert ranked[2].fairshare == ranked[3].fairshare == 1.0
