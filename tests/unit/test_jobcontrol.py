"""Job control, the pure parts: job references with array task ids, task membership in
an array's pending text, the queue order after ``gcontrol top`` (against a simple
reference), the time a suspended job has not run, the suspend command's payload, and
gcontrol's update settings and scontrol forms."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.cli.jobcontrol import resume_argv, update_argv, update_body
from gpusched.core.arrays import MAX_TASK_ID, fold
from gpusched.core.bounds import MAX_JOB_ID
from gpusched.core.jobcontrol import (
    JobRef,
    JobRefError,
    effective_limit,
    moved_to_top,
    parse_job_ref,
    parse_job_refs,
    suspended_seconds,
    task_in,
    top_first,
)
from gpusched.errors import UsageError
from gpusched.messages import NodeCommand
from gpusched.messages.jobcontrol import SuspendJob


@pytest.mark.parametrize(("text", "ref"), [
    ("12", JobRef(12)), (" 12_3 ", JobRef(12, 3)), ("7_0", JobRef(7, 0)),
    (str(MAX_JOB_ID), JobRef(MAX_JOB_ID)), (f"1_{MAX_TASK_ID}", JobRef(1, MAX_TASK_ID)),
])
def test_parse_job_ref(text: str, ref: JobRef) -> None:
    assert parse_job_ref(text) == ref
    assert parse_job_ref(ref.text()) == ref


@pytest.mark.parametrize("text", [
    "", "0", "-1", "12_", "_3", "12_-1", "12_3_4", "12.3", "1²", "12_[1-3]", "abc",
    str(MAX_JOB_ID + 1), f"1_{MAX_TASK_ID + 1}", "9" * 5000, "12 _3",
])
def test_parse_job_ref_refuses(text: str) -> None:
    with pytest.raises(JobRefError, match="invalid job id"):
        parse_job_ref(text)


def test_the_light_parser_knows_the_array_bound() -> None:
    from gpusched.core import bounds

    assert bounds.MAX_ARRAY_TASK_ID == MAX_TASK_ID
    assert bounds.parse_job_ref("12_3") == (12, 3) and bounds.parse_job_ref("12") == (12, None)
    assert bounds.parse_job_ref("12_1234567") is None and bounds.parse_job_ref("x_1") is None


def test_parse_job_refs_lists_and_dedups() -> None:
    assert parse_job_refs(["12,13_1", "12", "13_1,14"]) == [JobRef(12), JobRef(13, 1), JobRef(14)]
    with pytest.raises(JobRefError, match="at least one"):
        parse_job_refs([" , "])
    with pytest.raises(JobRefError, match="more than 2"):
        parse_job_refs(["1,2,3"], limit=2)


@given(st.sets(st.integers(0, 200), min_size=1, max_size=40), st.integers(0, 210))
def test_task_in_matches_membership(tasks: set[int], task: int) -> None:
    assert task_in(fold(sorted(tasks)), task) == (task in tasks)


def test_task_in_without_tasks() -> None:
    assert not task_in(None, 3) and not task_in("", 3)
    assert task_in("0-30:10", 20) and not task_in("0-30:10", 25)


@dataclass(frozen=True)
class Job:
    job_id: int
    uid: int
    partition: str = "gpu"
    account: str | None = None
    qos: str | None = None
    top: int | None = None


def reference_top(order: list[Job]) -> list[Job]:
    """Slurm's rule said plainly: a group's jobs, topped first (latest top first), fill
    the positions the group held, in queue order."""
    result = list(order)
    groups = {(j.uid, j.partition, j.account, j.qos) for j in order if j.top is not None}
    for key in groups:
        positions = [i for i, j in enumerate(order) if (j.uid, j.partition, j.account, j.qos) == key]
        members = [order[i] for i in positions]
        topped = [j for j in members if j.top is not None]
        topped.sort(key=lambda j: -(j.top or 0))
        rest = [j for j in members if j.top is None]
        for i, j in zip(positions, topped + rest):
            result[i] = j
    return result


jobs_strategy = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from(["gpu", "big"]), st.sampled_from([None, "a"]),
              st.one_of(st.none(), st.integers(1, 5))),
    max_size=30)


@given(jobs_strategy)
def test_top_first_matches_reference(raw: list[tuple[int, str, str | None, int | None]]) -> None:
    order = [Job(i + 1, uid, part, acct, None, top) for i, (uid, part, acct, top) in enumerate(raw)]
    moved = moved_to_top(order)
    assert moved == reference_top(order)
    assert sorted(j.job_id for j in moved) == [j.job_id for j in order]  # a permutation
    # No job of another user moves: every position holds a job of the same group.
    for before, after in zip(order, moved):
        assert (before.uid, before.partition, before.account) == \
            (after.uid, after.partition, after.account)


def test_top_first_puts_the_latest_first_and_keeps_others() -> None:
    a1, b1, a2, a3 = Job(1, 1), Job(2, 2), Job(3, 1, top=5), Job(4, 1, top=9)
    assert top_first([a1, b1, a2, a3], lambda j: j.uid, lambda j: j.top) == [a3, b1, a2, a1]
    untouched = [a1, b1]
    assert moved_to_top(untouched) is untouched


def test_suspended_time_and_effective_limit() -> None:
    assert suspended_seconds(10.0, None, 500.0) == 10.0
    assert suspended_seconds(10.0, 400.0, 430.0) == 40.0
    assert suspended_seconds(0.0, 430.0, 400.0) == 0.0  # a clock behind: nothing negative
    assert effective_limit(None, 50.0) is None
    assert effective_limit(600, 49.6) == 650


def test_suspend_command_payload() -> None:
    raw = {"kind": "suspend", "node": "n1", "job_id": 7, "run": 0, "seq": 3,
           "payload": {"suspend": False, "time_limit": 650, "deadline": 1_800_000_000.0}}
    command = NodeCommand.parse(raw)
    assert command.payload == SuspendJob(False, 650, 1_800_000_000.0)
    assert NodeCommand.parse(command.to_json()) == command
    for payload, words in (({}, "suspend: expected true or false"),
                           ({"suspend": 1}, "suspend"),
                           ({"suspend": True, "pids": [1]}, "pids"),
                           ({"suspend": False, "time_limit": -1}, "time_limit")):
        with pytest.raises(UsageError, match=words):
            NodeCommand.parse({**raw, "payload": payload})


def test_update_settings() -> None:
    body = update_body(["TimeLimit=1:00:00", "partition=big", "NumNodes=2-2", "Gres=gpu:4",
                        "JobName=x", "Dependency=", "QOS=high", "Priority=none",
                        "TresPerNode=gres/gpu:2", "MinNodes=3"])
    assert body == {"time_limit": 3600, "partition": "big", "nodes": 3, "gpus_per_node": 2,
                    "name": "x", "dependency": "", "qos": "high", "priority": None}
    assert update_body(["TimeLimit=UNLIMITED"]) == {"time_limit": "UNLIMITED"}
    assert update_body(["Nice"]) == {"nice": 100}
    assert update_body(["Nice=-5", "nice=+7"]) == {"nice": 7}  # the last wins


@pytest.mark.parametrize(("setting", "words"), [
    ("Colour=5", "invalid setting"), ("TimeLimit", "invalid setting"), ("JobName=", "invalid"),
    ("Nice=x", "Nice"), ("Nice=3000000000", "Nice"),
    ("NumNodes=1-4", "fixed number of nodes"), ("NumNodes=0", "at least 1"),
    ("Gres=gpu:a100:2", "type cannot change"), ("Gres=mps:20", "gpu:N"),
    ("TimeLimit=soon", "TimeLimit"), ("Priority=-1", "Priority"), ("Gres=gpu:1e3", "whole"),
])
def test_update_settings_refused(setting: str, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        update_body([setting])


def test_scontrol_forms() -> None:
    assert update_argv(["update", "JobId=12_3", "TimeLimit=5"]) == \
        ["update", "job", "12_3", "TimeLimit=5"]
    assert update_argv(["update", "job", "12"]) == ["update", "job", "12"]
    assert resume_argv(["resume", "17", "18"]) == ["resume", "job", "17", "18"]
    for kept in (["resume", "node", "n1"], ["resume", "gpu", "n1:0"], ["resume", "--help"]):
        assert resume_argv(kept) == kept


def test_run_time_leaves_out_the_time_suspended() -> None:
    from datetime import UTC, datetime

    from gpusched.cli import listing

    now = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    start, at = "2026-11-28T11:00:00+00:00", "2026-11-28T11:50:00+00:00"
    suspended = {"start_time": start, "suspended_seconds": 600, "suspended_at": at}
    assert listing.elapsed_seconds(suspended, now) == 3600 - 600 - 600
    ended = {**suspended, "end_time": "2026-11-28T11:55:00+00:00"}
    assert listing.elapsed_seconds(ended, now) == 3300 - 600 - 300
    resumed = {"start_time": start, "suspended_seconds": 600, "suspended_at": None}
    assert listing.elapsed_seconds(resumed, now) == 3000
    assert listing._run_times([start, None], [None, None], now,
                              [(600, at), (0, None)]) == ["40:00", "0:00"]


def test_the_pass_order_moves_topped_jobs_in_both_paths() -> None:
    from gpusched.core.model import PendingJob, Policy, Snapshot
    from gpusched.core.plan import ordered, queue_order
    from gpusched.core.priority import PriorityBreakdown

    jobs = (PendingJob(1, "gpu", 1, 1000, 10.0), PendingJob(2, "gpu", 1, 2000, 20.0),
            PendingJob(3, "gpu", 1, 1000, 30.0, top=1), PendingJob(4, "gpu", 1, 1000, 40.0))
    snapshot = Snapshot(nodes=(), partitions=(), pending=jobs, running=())
    # Every priority 0: submit order, then the top moves job 3 into job 1's place.
    assert [j.job_id for j in queue_order(snapshot, 100.0, Policy())] == [3, 2, 1, 4]
    # Computed priorities (here given), highest first: 4, 2, 1, 3 -> 3 takes 4's place.
    ranked = [PriorityBreakdown(i, 0, 0, 0, 0, 0, t) for i, t in ((4, .9), (2, .8), (1, .7),
                                                                  (3, .1))]
    assert [j.job_id for j in ordered(snapshot, ranked)] == [3, 2, 4, 1]
