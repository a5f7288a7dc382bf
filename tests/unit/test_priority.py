"""Multifactor priority: each factor alone, combined, and invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.fairshare import Account, FairShareTree, UserShare
from gpusched.core.priority import (
    PriorityInput,
    PriorityScale,
    PriorityWeights,
    job_priority,
    priorities,
)

ONLY = {name: 0.0 for name in ("age", "fairshare", "job_size", "partition", "qos")}
SCALE = PriorityScale(cluster_gpus=8, max_partition_tier=4, max_qos_priority=100)


def only(factor: str, **extra: object) -> PriorityWeights:
    return PriorityWeights(**{**ONLY, factor: 1.0, "max_age": 100.0, **extra})  # type: ignore[arg-type]


def job(job_id: int = 1, waited: float = 50.0, gpus: int = 2, fairshare: float = 0.75,
        tier: int = 1, qos: int = 50) -> PriorityInput:
    return PriorityInput(job_id, eligible_time=1000.0 - waited, gpus=gpus, fairshare=fairshare,
                         partition_tier=tier, qos_priority=qos)


@pytest.mark.parametrize(("factor", "extra", "inputs", "expected"), [
    ("age", {}, {"waited": 50.0}, 0.5),
    ("age", {}, {"waited": 150.0}, 1.0),  # capped at max_age
    ("age", {}, {"waited": -5.0}, 0.0),   # not yet eligible
    ("job_size", {}, {"gpus": 2}, 0.25),
    ("job_size", {"favor_small": True}, {"gpus": 2}, 0.75),
    ("partition", {}, {"tier": 1}, 0.25),
    ("qos", {}, {"qos": 50}, 0.5),
    ("fairshare", {}, {"fairshare": 0.75}, 0.75),
])
def test_each_factor_alone(factor: str, extra: dict[str, object], inputs: dict[str, float],
                           expected: float) -> None:
    result = job_priority(job(**inputs), 1000.0, only(factor, **extra), SCALE)  # type: ignore[arg-type]
    assert result.total == pytest.approx(expected)


def test_factors_combined_with_slurm_like_weights() -> None:
    weights = PriorityWeights(age=1000, fairshare=10000, job_size=1000, partition=1000,
                              qos=1000, max_age=100.0)
    result = job_priority(job(), 1000.0, weights, SCALE)
    assert (result.age, result.fairshare, result.job_size, result.partition, result.qos) == (
        0.5, 0.75, 0.25, 0.25, 0.5)
    assert result.total == pytest.approx((500 + 7500 + 250 + 250 + 500) / 14000)


def test_ordering_highest_first_ties_by_job_id() -> None:
    weights = PriorityWeights(age=1, fairshare=1, job_size=0, partition=0, qos=0, max_age=100.0)
    ranked = priorities([job(1, waited=10, fairshare=0.5), job(2, waited=90, fairshare=0.1),
                         job(3, waited=10, fairshare=0.9), job(4, waited=10, fairshare=0.5)],
                        1000.0, weights, SCALE)
    # totals (age + fairshare) / 2: job 1 .3, job 2 .5, job 3 .5, job 4 .3
    assert [b.job_id for b in ranked] == [2, 3, 1, 4]
    assert [round(b.total, 9) for b in ranked] == [0.5, 0.5, 0.3, 0.3]


def test_zero_weights_and_empty_scales_do_not_divide_by_zero() -> None:
    nothing = PriorityWeights(**ONLY)  # type: ignore[arg-type]
    assert job_priority(job(), 1000.0, nothing, PriorityScale(0)).total == 0.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=3, max_size=3), st.integers(1, 10_000),
       st.floats(0, 1e6), st.integers(0, 8))
def test_more_usage_never_raises_a_jobs_priority(usage: list[int], extra: int, waited: float,
                                                 gpus: int) -> None:
    tree = FairShareTree([Account("a", "root", 2), Account("b", "root", 1)],
                         [UserShare("x", "a"), UserShare("y", "a"), UserShare("z", "b")])
    keys = [("x", "a"), ("y", "a"), ("z", "b")]
    before = dict(zip(keys, map(float, usage)))
    after = {**before, ("x", "a"): before[("x", "a")] + extra}
    weights = PriorityWeights()
    for method in (tree.fair_tree, tree.classic):
        mine = [job_priority(job(waited=waited, gpus=gpus, fairshare=method(u)[("x", "a")]),
                             1000.0, weights, SCALE).total for u in (before, after)]
        assert mine[1] <= mine[0]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e5, 1e6), st.integers(0, 16), st.floats(0, 1)),
                max_size=30))
def test_priorities_are_deterministic_and_bounded(rows: list[tuple[float, int, float]]) -> None:
    jobs = [job(i, waited=w, gpus=g, fairshare=f) for i, (w, g, f) in enumerate(rows)]
    first = priorities(jobs, 1000.0, PriorityWeights(), SCALE)
    assert first == priorities(list(reversed(jobs)), 1000.0, PriorityWeights(), SCALE)
    assert all(0.0 <= b.total <= 1.0 for b in first)
