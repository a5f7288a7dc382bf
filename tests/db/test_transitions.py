"""Guarded state changes against a real database: retries and races change nothing."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import PartitionConfig
from gpusched.core.model import Plan, Start
from gpusched.db import agents, commands, job_views, jobs, node_failure, submit
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.models import Allocation, Job, JobScript, Node
from gpusched.db.partitions import sync_partitions
from gpusched.db.schedule import apply_plan, load_snapshot
from gpusched.errors import Conflict, NotFound, PermissionDenied, UsageError

ALICE = jobs.Identity(1000, 1000)
BOB = jobs.Identity(1001, 1001)
ROOT = jobs.Identity(0, 0)


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url, pool_size=2)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),
                            PartitionConfig("short", max_time=3600)))
        agents.register_node(s, {"node": "n1", "uid": 0, "gpus": [
            {"index": i, "uuid": f"GPU-{i}"} for i in range(2)]})
    yield factory
    engine.dispose()


def _submit(sessions: sessionmaker[Session], who: jobs.Identity = ALICE, **body: object) -> int:
    with sessions() as s, s.begin():
        return submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", **body}, who).id


def _schedule(sessions: sessionmaker[Session], plan: Plan) -> set[str]:
    with sessions() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        return apply_plan(s, snapshot, plan, node_ids)


def test_a_failed_launch_ends_the_job_with_its_reason(sessions: sessionmaker[Session]) -> None:
    job_id = _submit(sessions, gpus=1)
    _schedule(sessions, Plan(starts=(Start(job_id, "n1", ("GPU-0",)),)))
    with sessions() as s, s.begin():
        assert agents.record_end(s, job_id, {
            "node": "n1", "outcome": "launch_failed",
            "error": "this node does not run jobs as uid 0\0" + "x" * 5000})
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None and (job.state, job.reason) == ("FAILED", "LaunchFailed")
        assert job.error_message is not None and len(job.error_message) == 2000
        assert job.error_message.startswith("this node does not run jobs as uid 0x")


def _state(sessions: sessionmaker[Session], job_id: int) -> str:
    with sessions() as s:
        return s.get(Job, job_id).state  # type: ignore[union-attr]


def test_end_reported_twice_is_recorded_once(sessions: sessionmaker[Session]) -> None:
    job_id = _submit(sessions, gpus=2)
    assert _schedule(sessions, Plan(starts=(Start(job_id, "n1", ("GPU-0", "GPU-1")),))) == {"n1"}
    end = {"node": "n1", "outcome": "failed", "exit_code": 3, "signal": None, "end_time": 1e9}
    with sessions() as s, s.begin():
        assert agents.record_end(s, job_id, end)
    with sessions() as s, s.begin():
        assert not agents.record_end(s, job_id, {**end, "outcome": "completed", "exit_code": 0})
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None and (job.state, job.exit_code) == ("FAILED", 3)
        held = s.scalar(select(func.count()).select_from(Allocation)
                        .where(Allocation.released_at.is_(None)))
        assert held == 0


def test_a_start_for_a_job_cancelled_after_the_snapshot_is_skipped(
        sessions: sessionmaker[Session]) -> None:
    job_id = _submit(sessions, gpus=1)
    with sessions() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
    with sessions() as s, s.begin():
        jobs.cancel_job(s, job_id, ALICE)
    with sessions() as s, s.begin():
        woken = apply_plan(s, snapshot, Plan(starts=(Start(job_id, "n1", ("GPU-0",)),)), node_ids)
    assert woken == set() and _state(sessions, job_id) == "CANCELLED"
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Allocation)) == 0


def test_the_database_refuses_one_gpu_for_two_jobs(sessions: sessionmaker[Session]) -> None:
    first, second = _submit(sessions, gpus=1), _submit(sessions, gpus=1)
    _schedule(sessions, Plan(starts=(Start(first, "n1", ("GPU-0",)),)))
    with pytest.raises(IntegrityError):
        _schedule(sessions, Plan(starts=(Start(second, "n1", ("GPU-0",)),)))
    assert _state(sessions, second) == "PENDING"  # the failed pass rolled back entirely


def test_cancel_rules(sessions: sessionmaker[Session]) -> None:
    pending = _submit(sessions)
    with sessions() as s, s.begin(), pytest.raises(PermissionDenied):
        jobs.cancel_job(s, pending, BOB)
    running = _submit(sessions, gpus=1)
    _schedule(sessions, Plan(starts=(Start(running, "n1", ("GPU-0",)),)))
    with sessions() as s, s.begin():
        job, node = jobs.cancel_job(s, running, ROOT)  # root may cancel anyone's job
        assert (job.state, node) == ("RUNNING", {"n1"}) and job.cancel_requested_at is not None
    with sessions() as s, s.begin():
        assert jobs.cancel_job(s, pending, ALICE)[0].state == "CANCELLED"
    with sessions() as s, s.begin(), pytest.raises(Conflict):
        jobs.cancel_job(s, pending, ALICE)
    with sessions() as s, s.begin():
        work = commands.claim(s, s.scalars(select(Node)).one())
        assert [(c.kind, c.job_id, c.run) for c in work] == [
            ("launch", running, 0), ("cancel", running, 0)]
        for command in work:
            assert commands.complete(s, s.scalars(select(Node)).one(), command.seq)
    with sessions() as s, s.begin():
        assert commands.claim(s, s.scalars(select(Node)).one()) == []  # all done


def test_silent_node_goes_down_and_must_register_again(
        sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        assert node_failure.fail_silent_nodes(s, timeout=60).nodes == []
        s.execute(update(Node).values(last_seen=datetime.now(UTC) - timedelta(minutes=5)))
    with sessions() as s, s.begin():
        assert node_failure.fail_silent_nodes(s, timeout=60).nodes == ["n1"]
    with sessions() as s, s.begin(), pytest.raises(NotFound, match="must register again"):
        agents.heartbeat(s, "n1")
    with sessions() as s:
        node = s.scalars(select(Node)).one()
        assert (node.state, node.reason, node.lost_at is not None) == ("DOWN", "NotResponding",
                                                                       True)
    with sessions() as s, s.begin():
        agents.register_node(s, {"node": "n1", "uid": 0, "gpus": [
            {"index": i, "uuid": f"GPU-{i}"} for i in range(2)]})
    with sessions() as s, s.begin():
        node = agents.heartbeat(s, "n1")
        assert (node.state, node.reason, node.lost_at) == ("UP", None, None)


@pytest.mark.parametrize(("partition", "limit", "stored"), [
    ("gpu", None, None), ("gpu", "UNLIMITED", None), ("short", None, 3600), ("short", 60, 60)])
def test_time_limit_defaults(sessions: sessionmaker[Session], partition: str,
                             limit: object, stored: int | None) -> None:
    job_id = _submit(sessions, partition=partition, time_limit=limit)
    with sessions() as s:
        assert s.get(Job, job_id).time_limit == stored  # type: ignore[union-attr]


@pytest.mark.parametrize("body", [
    {"time_limit": "UNLIMITED", "partition": "short"}, {"time_limit": 7200, "partition": "short"},
    {"time_limit": "soon"}, {"gpus": True}, {"gpus": 3}, {"script": "echo no shebang"},
    {"work_dir": "relative"}, {"environment": {"A": 1}}, {"name": "a\nb"}, {"args": [1]}])
def test_invalid_submissions_store_nothing(sessions: sessionmaker[Session],
                                           body: dict[str, object]) -> None:
    with pytest.raises(UsageError), sessions() as s, s.begin():
        submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", **body}, ALICE)
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 0
        assert s.scalar(select(func.count()).select_from(JobScript)) == 0


def test_a_jobs_script_and_environment_live_outside_its_row(
        sessions: sessionmaker[Session]) -> None:
    """The pass and the queue listing read every pending row: a large environment and
    script do not make it larger (revision 0011), yet the job's owner sees both."""
    environment = {f"VAR_{i}": f"/opt/site/{i:04d}/lib:/usr/local/{i * 7919 % 10007}/bin"
                   for i in range(60)}
    script = "#!/bin/sh\n" + "".join(f"echo step {i} $VAR_{i}\n" for i in range(60))
    small = _submit(sessions)
    large = _submit(sessions, environment=environment, script=script, args=["a", "b"])
    with sessions() as s:
        sizes = dict(s.execute(text("SELECT id, pg_column_size(jobs.*) FROM jobs")).all())
        shown = job_views.get_job(s, large, ALICE)
        hidden = job_views.get_job(s, large, BOB)
    assert len(str(environment)) + len(script) > 4000
    assert sizes[large] == sizes[small] < 500
    assert (shown["environment"], shown["script"], shown["args"]) == (environment, script, ["a", "b"])
    assert not {"environment", "script", "args"} & set(hidden)
