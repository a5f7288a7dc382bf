"""Dependencies: parsing, verdicts, and their effect on a pass."""

from __future__ import annotations

import pytest

from gpusched.core.dependency import (
    Dependency,
    DependencyError,
    dependency_reason,
    parse_dependency,
)
from gpusched.core.model import (
    GpuView,
    JobState,
    NodeState,
    NodeView,
    PartitionView,
    PendingJob,
    Policy,
    Reason,
    Snapshot,
)
from gpusched.core.plan import plan

C, F, R, P, CA = (JobState.COMPLETED, JobState.FAILED, JobState.RUNNING, JobState.PENDING,
                  JobState.CANCELLED)


def test_parse() -> None:
    assert parse_dependency("afterok:12:13,singleton") == (
        Dependency("afterok", (12, 13)), Dependency("singleton"))
    for bad in ("before:1", "afterok", "afterok:x", "afterok:0", "singleton:3", ""):
        with pytest.raises(DependencyError):
            parse_dependency(bad)


@pytest.mark.parametrize(("text", "states", "expected"), [
    ("afterok:1", {1: R}, Reason.DEPENDENCY),
    ("afterok:1", {1: C}, None),
    ("afterok:1:2", {1: C, 2: P}, Reason.DEPENDENCY),
    ("afterok:1:2", {1: C, 2: F}, Reason.DEPENDENCY_NEVER_SATISFIED),
    ("afterok:1", {1: CA}, Reason.DEPENDENCY_NEVER_SATISFIED),
    ("afternotok:1", {1: F}, None),
    ("afternotok:1", {1: C}, Reason.DEPENDENCY_NEVER_SATISFIED),
    ("afterany:1:2", {1: F, 2: C}, None),
    ("afterany:1", {1: R}, Reason.DEPENDENCY),
    ("afterok:1,afterany:2", {1: C, 2: R}, Reason.DEPENDENCY),
])
def test_verdicts(text: str, states: dict[int, JobState], expected: Reason | None) -> None:
    assert dependency_reason(parse_dependency(text), states, singleton_busy=False) == expected


def _snapshot(jobs: list[PendingJob], states: dict[int, JobState],
              running_names: frozenset[tuple[str, str]] = frozenset()) -> Snapshot:
    node = NodeView("a", NodeState.UP, tuple(GpuView(f"g{i}", i) for i in range(4)))
    return Snapshot((node,), (PartitionView("gpu", ("a",)),), tuple(jobs),
                    job_states=states, running_names=running_names)


def _job(job_id: int, dependency: str | None = None, name: str = "x") -> PendingJob:
    return PendingJob(job_id, "gpu", 1, 1000, float(job_id), user="alice", dependency=dependency,
                      name=name)


def test_a_chain_waits_and_a_failed_parent_is_never_satisfied() -> None:
    jobs = [_job(2, "afterok:1"), _job(3, "afterok:2"), _job(4)]
    result = plan(_snapshot(jobs, {1: R, 2: P}), 0.0, Policy())
    assert [s.job_id for s in result.starts] == [4]  # dependent jobs block nobody
    assert {p.job_id: p.reason for p in result.pending} == {2: Reason.DEPENDENCY, 3: Reason.DEPENDENCY}
    failed = plan(_snapshot(jobs[:1], {1: F}), 0.0, Policy())
    assert failed.pending[0].reason is Reason.DEPENDENCY_NEVER_SATISFIED
    assert [s.job_id for s in plan(_snapshot(jobs[:1], {1: C}), 0.0, Policy()).starts] == [2]


def test_singleton_runs_one_same_named_job_at_a_time() -> None:
    jobs = [_job(1, "singleton", "train"), _job(2, "singleton", "train"), _job(3, "singleton", "eval")]
    result = plan(_snapshot(jobs, {}), 0.0, Policy())
    assert [s.job_id for s in result.starts] == [1, 3]
    assert {p.job_id: p.reason for p in result.pending} == {2: Reason.DEPENDENCY}
    busy = plan(_snapshot(jobs[:1], {}, frozenset({("alice", "train")})), 0.0, Policy())
    assert busy.pending[0].reason is Reason.DEPENDENCY
