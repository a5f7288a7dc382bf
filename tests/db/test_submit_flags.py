"""--nice, --priority, --open-mode, --time-min and --deadline against a real database:
stored, refused where the caller may not (a negative nice, a priority) or where they
cannot hold, read back by both of the pass's queue readers, a cut time limit and a
DEADLINE end written by a plan's apply, and the open mode in the launch order."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpusched.core.model import Pending, Plan, Reason, Start
from gpusched.db import commands, submit
from gpusched.db.jobs import Identity
from gpusched.db.models import Job, Node
from gpusched.db.pending_rows import read_pending
from gpusched.db.schedule import apply_plan, load_snapshot
from gpusched.errors import PermissionDenied, UsageError
from gpusched.messages import LaunchOrder
from tests.db.node import ALICE, node_sessions

GPUS = [{"index": 0, "uuid": "GPU-0"}, {"index": 1, "uuid": "GPU-1"}]
ADMIN = Identity(1001, 1001, name="root-ish", admin=True)


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    with node_sessions(db_url, GPUS) as factory:
        yield factory


def _submit(sessions: sessionmaker[Session], who: Identity = ALICE, **body: object) -> int:
    with sessions() as s, s.begin():
        return submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", "gpus": 1,
                                     "time_limit": 7200, **body}, who).id


def _job(sessions: sessionmaker[Session], job_id: int) -> Job:
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None
        s.expunge(job)
        return job


def test_flags_are_stored_and_read_by_the_pass(sessions: sessionmaker[Session]) -> None:
    deadline = datetime.now(UTC) + timedelta(hours=5)
    job_id = _submit(sessions, nice=50, open_mode="truncate", time_min=600,
                     deadline=deadline.isoformat())
    admin_id = _submit(sessions, ADMIN, nice=-20, priority=3.5)
    plain = _submit(sessions)
    job = _job(sessions, job_id)
    assert (job.nice, job.open_mode, job.time_min, job.deadline) == (
        50, "truncate", 600, deadline)
    assert (_job(sessions, admin_id).nice, _job(sessions, admin_id).admin_priority) == (-20, 3.5)
    with sessions() as s:
        snapshot, _ = load_snapshot(s)  # the JSON reader of the kept queue
        direct = read_pending(s)  # the ORM-free reader
    for queue in (snapshot.pending, direct):
        by_id = {j.job_id: j for j in queue}
        assert (by_id[job_id].nice, by_id[job_id].time_min) == (50, 600)
        assert by_id[job_id].deadline == pytest.approx(deadline.timestamp())
        assert (by_id[admin_id].nice, by_id[admin_id].priority) == (-20, 3.5)
        assert (by_id[plain].nice, by_id[plain].time_min, by_id[plain].deadline) == (0, None, None)


@pytest.mark.parametrize(("body", "error", "words"), [
    ({"nice": -1}, PermissionDenied, "negative nice"),
    ({"priority": 10}, PermissionDenied, "administrator"),
    ({"nice": 2**31}, UsageError, "nice"),
    ({"open_mode": "replace"}, UsageError, "open_mode"),
    ({"time_min": 9000}, UsageError, "time_min"),
    ({"time_min": 60, "gpu_mem_mb": 1024}, UsageError, "GPU memory"),
    ({"time_min": 60, "exclusive": True}, UsageError, "--exclusive"),
    ({"deadline": "2020-01-01T00:00:00+00:00"}, UsageError, "has passed"),
    ({"deadline": "tomorrow"}, UsageError, "deadline"),
    ({"deadline": "2099-01-01T00:00:00+00:00", "time_limit": "UNLIMITED"}, UsageError,
     "no time limit"),
    ({"deadline": "2099-01-01T00:00:00+00:00", "begin_time": "2099-02-01T00:00:00+00:00"},
     UsageError, "before the begin time"),
])
def test_refusals_store_nothing(sessions: sessionmaker[Session], body: dict[str, object],
                                error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words):
        _submit(sessions, **body)
    with sessions() as s:
        assert s.scalars(select(Job.id)).all() == []


def test_apply_cuts_limits_and_ends_jobs_past_their_deadline(
        sessions: sessionmaker[Session]) -> None:
    cut = _submit(sessions, time_min=600, open_mode="truncate")
    late = _submit(sessions, deadline=(datetime.now(UTC) + timedelta(hours=3)).isoformat())
    array = _submit(sessions, array="0-1", nice=5, time_min=60, open_mode="append")
    with sessions() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        apply_plan(s, snapshot, Plan(
            starts=(Start(cut, "n1", ("GPU-0",), time_limit=1800),
                    Start(array, "n1", ("GPU-1",), 0, time_limit=900)),
            pending=(Pending(late, Reason.DEADLINE), Pending(array, Reason.RESOURCES))),
            node_ids)
    assert (_job(sessions, cut).state, _job(sessions, cut).time_limit) == ("RUNNING", 1800)
    ended = _job(sessions, late)
    assert (ended.state, ended.reason) == ("DEADLINE", "DeadLine")
    assert ended.end_time is not None
    with sessions() as s:
        task = s.scalars(select(Job).where(Job.array_job_id == array,
                                           Job.array_task_id == 0)).one()
        assert (task.time_limit, task.nice, task.time_min, task.open_mode) == (
            900, 5, 60, "append")
        assert s.get(Job, array).time_limit == 7200  # the record keeps its own
    with sessions() as s, s.begin():
        node = s.scalars(select(Node).where(Node.name == "n1")).one()
        orders = {c.job_id: c.payload for c in commands.claim(s, node)}
    order = orders[cut]
    assert isinstance(order, LaunchOrder)
    assert (order.open_mode, order.time_limit) == ("truncate", 1800)
    assert LaunchOrder.parse(order.to_json()) == order
    assert "open_mode" not in LaunchOrder.parse({**order.to_json(), "open_mode": None}).to_json()
