"""Why a job waits: every blocker, ranked, in words that say what would unblock it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpusched.core.explain import NotPending, explain
from gpusched.core.model import (
    JobState,
    PartitionView,
    PendingJob,
    Policy,
    QosLimits,
    Reason,
    RunningJob,
    Snapshot,
)
from gpusched.core.plan import plan
from gpusched.core.priority import PriorityWeights
from tests.unit.test_plan import node, reasons

NOW = 1_000_000.0
AGE_ONLY = Policy(weights=PriorityWeights(age=1000, fairshare=0, job_size=0, partition=0, qos=0))


def pending(job_id: int, gpus: int, **fields: object) -> PendingJob:
    return replace(PendingJob(job_id, "gpu", gpus, 1000, NOW - 1000 + job_id, user="alice"),
                   **fields)  # type: ignore[arg-type]


def snap(jobs: list[PendingJob], running: list[RunningJob] = (),  # type: ignore[assignment]
         part: PartitionView | None = None, **fields: object) -> Snapshot:
    nodes = (node("n0", 4), node("n1", 2))
    return Snapshot(nodes, (part or PartitionView("gpu", ("n0", "n1")),), tuple(jobs),
                    tuple(running), **fields)  # type: ignore[arg-type]


def test_resources_says_how_many_gpus_would_start_now() -> None:
    busy = [RunningJob(90, "n0", ("n0-g0", "n0-g1"))]
    why = explain(snap([pending(1, 4)], busy), NOW, AGE_ONLY, 1)
    assert why.reason is Reason.RESOURCES and why.starts == ()
    assert [(b.reason, b.detail) for b in why.blockers] == [(
        Reason.RESOURCES,
        "it needs 4 GPUs on one node; the most free now is 2 (on n0): would start now with "
        "<= 2 GPUs")]
    full = [RunningJob(90, "n0", tuple(f"n0-g{i}" for i in range(4))),
            RunningJob(91, "n1", ("n1-g0", "n1-g1"))]
    assert "every GPU of partition gpu is in use" in explain(
        snap([pending(1, 1)], full), NOW, AGE_ONLY, 1).blockers[0].detail


def test_an_exclusive_job_waits_for_an_idle_node() -> None:
    busy = [RunningJob(90, "n0", ("n0-g0",)), RunningJob(91, "n1", ())]
    why = explain(snap([pending(1, 1, exclusive=True)], busy), NOW, AGE_ONLY, 1)
    assert why.reason is Reason.RESOURCES and why.starts == ()
    assert [(b.reason, b.detail) for b in why.blockers] == [(
        Reason.RESOURCES,
        "it takes whole nodes (--exclusive): it needs 1 node(s) of partition gpu with "
        "nothing running, and fewer are idle now: it starts when enough nodes empty")]
    ready = explain(snap([pending(1, 1, exclusive=True)], busy[:1]), NOW, AGE_ONLY, 1)
    assert ready.reason is Reason.NONE and ready.blockers == ()
    assert [(s.node, len(s.gpu_uuids)) for s in ready.starts] == [("n1", 2)]


def test_priority_names_the_job_ahead_and_both_priorities() -> None:
    big, small = pending(1, 8 - 4), pending(2, 4)  # 1 is older: higher age priority
    busy = [RunningJob(90, "n0", ("n0-g0",))]
    why = explain(snap([big, small], busy), NOW, AGE_ONLY, 2)
    assert why.reason is Reason.PRIORITY and (why.position, why.queue_length) == (2, 2)
    first = why.blockers[0]
    assert first.reason is Reason.PRIORITY
    assert first.detail.startswith("behind job 1 (priority ")
    numbers = first.detail.split("(priority ")[1].split(")")[0].split(" > ")
    assert float(numbers[0]) > float(numbers[1]) == pytest.approx(why.priority, rel=1e-3)
    assert [b.reason for b in why.blockers] == [Reason.PRIORITY, Reason.RESOURCES]


def test_every_blocker_is_listed_most_fundamental_first() -> None:
    running = [RunningJob(90, "n1", ("n1-g0", "n1-g1"), "alice", None, "normal")]
    job = pending(1, 2, hold="user", dependency="afterok:90", qos="normal")
    why = explain(snap([job], running, qos_limits={"normal": QosLimits(max_gpus_per_user=3)},
                       job_states={90: JobState.RUNNING}), NOW, AGE_ONLY, 1)
    assert why.reason is Reason.JOB_HELD_USER
    assert [b.reason for b in why.blockers] == [
        Reason.JOB_HELD_USER, Reason.DEPENDENCY, Reason.QOS_MAX_GPUS_PER_USER]
    details = [b.detail for b in why.blockers]
    assert details[0] == "held by its owner: it becomes eligible after 'gcontrol release 1'"
    assert details[1].startswith("afterok:90 waits for job 90 (RUNNING) to end")
    assert details[2] == ("alice holds 2 of the 3 GPUs QOS normal allows per user: would "
                          "start now with <= 1 GPUs")


def test_a_failed_parent_is_named_and_the_job_will_never_run() -> None:
    job = pending(1, 1, dependency="afterok:5:6")
    why = explain(snap([job], job_states={5: JobState.FAILED, 6: JobState.COMPLETED}),
                  NOW, AGE_ONLY, 1)
    assert why.reason is Reason.DEPENDENCY_NEVER_SATISFIED
    assert why.blockers[0].detail == ("afterok:5 can never be met: job 5 ended FAILED: it will "
                                      "stay pending; cancel it (gcancel 1)")


@pytest.mark.parametrize(("part", "job", "reason", "words"), [
    (PartitionView("gpu", ("n0", "n1"), max_time=3600), pending(1, 1, time_limit=7200),
     Reason.PARTITION_TIME_LIMIT, "exceeds the MaxTime 1:00:00 of partition gpu"),
    (PartitionView("gpu", ("n0", "n1"), max_time=3600), pending(1, 1),
     Reason.PARTITION_TIME_LIMIT, "exceeds the MaxTime"),  # no limit is above any MaxTime
    (PartitionView("gpu", ("n0", "n1"), allow_accounts=frozenset({"bio"})),
     pending(1, 1, account="phys"), Reason.ACCOUNT_NOT_ALLOWED, "does not allow account phys"),
    (PartitionView("gpu", ("n0", "n1"), deny_accounts=frozenset({"phys"})),
     pending(1, 1, account="phys"), Reason.ACCOUNT_NOT_ALLOWED, "does not allow account phys"),
    (PartitionView("gpu", ("n0", "n1"), max_gpus_per_job=2), pending(1, 3),
     Reason.PARTITION_CONFIG, "more than the 2 per job"),
    (PartitionView("gpu", ("n0", "n1"), up=False), pending(1, 1),
     Reason.PARTITION_DOWN, "is down"),
])
def test_partition_rules_changed_after_submission_hold_the_job_and_no_one_else(
        part: PartitionView, job: PendingJob, reason: Reason, words: str) -> None:
    later = pending(2, 1, time_limit=60)
    decided = plan(snap([job, later], part=part), NOW, AGE_ONLY)
    assert reasons(decided)[1] is reason
    if part.up:
        assert [s.job_id for s in decided.starts] == [2]  # it blocks nobody
    why = explain(snap([job, later], part=part), NOW, AGE_ONLY, 1)
    assert why.blockers[0].reason is reason and words in why.blockers[0].detail


def test_begin_time_and_array_cap_details() -> None:
    later = pending(1, 1, begin_time=NOW + 3723)
    detail = explain(snap([later]), NOW, AGE_ONLY, 1).blockers[0].detail
    assert detail == "it may not start before 1970-01-12T14:48:43+00:00, in 1:02:03"
    array = pending(7, 1, array_job_id=7, array_tasks="2-9", array_max_running=2)
    tasks = [RunningJob(20, "n0", ("n0-g0",), array_job_id=7),
             RunningJob(21, "n0", ("n0-g1",), array_job_id=7)]
    why = explain(snap([array], tasks), NOW, AGE_ONLY, 7)
    assert why.blockers[0].detail == ("2 task(s) of array 7 run, the most its %2 allows: the "
                                      "next starts when one ends")


def test_an_array_that_starts_some_tasks_says_why_the_rest_wait() -> None:
    array = pending(7, 2, array_job_id=7, array_tasks="0-9")
    why = explain(snap([array]), NOW, AGE_ONLY, 7)
    assert [s.array_task_id for s in why.starts] == [0, 1, 2]
    assert why.reason is Reason.RESOURCES
    assert why.blockers[-1].detail == ("3 of its tasks start in this pass; the next waits: no "
                                       "node has enough GPUs left for it")


def test_a_job_that_would_start_has_no_blockers_and_a_ended_one_has_no_explanation() -> None:
    why = explain(snap([pending(1, 2)]), NOW, AGE_ONLY, 1)
    assert (why.reason, why.blockers) == (Reason.NONE, ())
    assert [(s.node, len(s.gpu_uuids)) for s in why.starts] == [("n1", 2)]  # best fit
    with pytest.raises(NotPending):
        explain(snap([pending(1, 2)]), NOW, AGE_ONLY, 99)


def test_the_explanation_agrees_with_the_plan() -> None:
    jobs = [pending(1, 4), pending(2, 2, hold="admin"), pending(3, 2), pending(4, 1)]
    busy = [RunningJob(90, "n0", ("n0-g0",))]
    decided = reasons(plan(snap(jobs, busy), NOW, AGE_ONLY))
    for job in jobs:
        why = explain(snap(jobs, busy), NOW, AGE_ONLY, job.job_id)
        assert why.reason is decided.get(job.job_id, Reason.NONE)
        if why.reason is not Reason.NONE:
            assert why.blockers[0].reason is why.reason or why.reason is Reason.RESOURCES
