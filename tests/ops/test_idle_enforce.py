"""db/idle_policy.enforce against a real database: the notice and cancel commands it
makes, each step once, the warning lifted when the GPUs get busy or the policy goes,
and a job that may not be requeued cancelled instead."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpusched.db import agents, health, idle_policy
from gpusched.db.models import Job, NodeCommand, Partition
from tests.db.node import node_sessions, start_on


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    with node_sessions(db_url, [{"index": 0, "uuid": "GPU-0"}, {"index": 1, "uuid": "GPU-1"}]
                       ) as factory:
        with factory() as s, s.begin():
            s.execute(update(Partition).where(Partition.name == "gpu").values(
                idle_warn_after=60, idle_action="requeue", idle_action_after=30))
        yield factory


def _sample(sessions: sessionmaker[Session], **utils: int) -> set[str]:
    gpus = [{"uuid": uuid.replace("_", "-"), "util": util, "mem_used_mb": 0,
             "temperature": 40, "power_mw": 50000} for uuid, util in utils.items()]
    with sessions() as s, s.begin():
        health.record_samples(s, "n1", {"gpus": gpus}, 1.0, 3600)
        return idle_policy.enforce(s, "n1", 1.0)


def _age(sessions: sessionmaker[Session], job_id: int, **seconds_ago: float) -> None:
    """Move the job's idle times into the past."""
    now = datetime.now(UTC)
    with sessions() as s, s.begin():
        s.execute(update(Job).where(Job.id == job_id).values(
            **{k: now - timedelta(seconds=v) for k, v in seconds_ago.items()}))


def _commands(sessions: sessionmaker[Session], job_id: int) -> list[tuple[str, str]]:
    with sessions() as s:
        return [(c.kind, c.payload.get("text", "")) for c in s.scalars(
            select(NodeCommand).where(NodeCommand.job_id == job_id, NodeCommand.kind != "launch")
            .order_by(NodeCommand.id))]


def _job(sessions: sessionmaker[Session], job_id: int) -> Job:
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None
        s.expunge(job)
        return job


def test_warned_once_then_requeued_once_with_the_reason(sessions: sessionmaker[Session]) -> None:
    job_id = start_on(sessions, ("GPU-0",))
    assert _sample(sessions, GPU_0=0) == set()  # idle from now: nothing due yet
    assert _job(sessions, job_id).idle_since is not None and _commands(sessions, job_id) == []
    _age(sessions, job_id, idle_since=61)
    assert _sample(sessions, GPU_0=0) == {"n1"}
    assert _sample(sessions, GPU_0=1) == set()  # at the threshold is idle; warned once only
    (kind, text), = _commands(sessions, job_id)
    assert kind == "notice" and text.startswith(f"gpusched: job {job_id}: ")
    assert text.endswith(": warning: its GPUs idle (at most 1% busy) for 1:01 (partition gpu "
                         "idle policy); it will be requeued in 0:30 unless they are used")
    assert _job(sessions, job_id).idle_warned_at is not None
    _age(sessions, job_id, idle_since=95, idle_warned_at=31)
    assert _sample(sessions, GPU_0=0) == {"n1"}
    assert _sample(sessions, GPU_0=0) == set()  # being stopped: nothing more
    kinds = [kind for kind, _ in _commands(sessions, job_id)]
    assert kinds == ["notice", "notice", "cancel"]  # the line goes out before the cancel
    job = _job(sessions, job_id)
    assert (job.idle_action, job.idle_warned_at, job.preempt_mode) == ("requeue", None, "requeue")
    assert job.idle_reason == ("GPUs idle (at most 1% busy) for 1:35, 0:31 after the warning "
                               "(partition gpu idle policy)")
    assert job.error_message == f"requeued: {job.idle_reason}"
    with sessions() as s, s.begin():
        assert agents.record_end(s, job_id, {"node": "n1", "outcome": "cancelled",
                                             "signal": 15, "end_time": 1e9})
    job = _job(sessions, job_id)
    assert (job.state, job.restarts, job.idle_action) == ("PENDING", 1, "requeue")
    assert (job.idle_since, job.idle_warned_at) == (None, None)  # the next run starts afresh


def test_busy_gpus_lift_the_warning_and_a_busy_job_is_never_warned(
        sessions: sessionmaker[Session]) -> None:
    idle = start_on(sessions, ("GPU-0",))
    busy = start_on(sessions, ("GPU-1",))
    _sample(sessions, GPU_0=0, GPU_1=80)
    _age(sessions, idle, idle_since=61)
    assert _sample(sessions, GPU_0=0, GPU_1=80) == {"n1"}
    assert _sample(sessions, GPU_0=5, GPU_1=80) == {"n1"}
    texts = [t.split(": ", 3)[3] for _, t in _commands(sessions, idle)]
    assert len(texts) == 2 and texts[0].startswith("warning: its GPUs idle")
    assert texts[1] == "its GPUs are busy again; the idle warning is lifted"
    assert (_job(sessions, idle).idle_warned_at, _job(sessions, idle).idle_since) == (None, None)
    assert _commands(sessions, busy) == [] and _job(sessions, busy).idle_since is None


def test_no_policy_any_more_lifts_the_warning(sessions: sessionmaker[Session]) -> None:
    job_id = start_on(sessions, ("GPU-0",))
    _sample(sessions, GPU_0=0)
    _age(sessions, job_id, idle_since=61)
    _sample(sessions, GPU_0=0)
    with sessions() as s, s.begin():
        s.execute(update(Partition).values(idle_warn_after=None, idle_action=None,
                                           idle_action_after=None))
    assert _sample(sessions, GPU_0=0) == {"n1"}
    assert _commands(sessions, job_id)[-1][1].endswith(
        ": no idle policy applies to it any more; the idle warning is lifted")
    _age(sessions, job_id, idle_since=10_000)
    assert _sample(sessions, GPU_0=0) == set() and _job(sessions, job_id).idle_warned_at is None


def test_a_job_that_may_not_be_requeued_is_cancelled(sessions: sessionmaker[Session]) -> None:
    job_id = start_on(sessions, ("GPU-0",), requeue=False)
    _sample(sessions, GPU_0=0)
    _age(sessions, job_id, idle_since=61)
    _sample(sessions, GPU_0=0)
    _age(sessions, job_id, idle_since=100, idle_warned_at=40)
    _sample(sessions, GPU_0=0)
    job = _job(sessions, job_id)
    assert job.idle_action == "cancel" and job.preempt_mode is None
    assert job.idle_reason.endswith("; cancelled instead of requeued: the job may not be "
                                    "requeued")
    assert _commands(sessions, job_id)[1][1].split(": ", 3)[3].startswith("cancelled: its GPUs")
    with sessions() as s, s.begin():
        agents.record_end(s, job_id, {"node": "n1", "outcome": "cancelled", "signal": 15,
                                      "end_time": 1e9})
    assert _job(sessions, job_id).state == "CANCELLED"
