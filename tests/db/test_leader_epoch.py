"""The leader epoch against a real PostgreSQL: each leadership term opens the next
epoch; a plan applied under an epoch that is over is refused and writes nothing; a new
epoch waits for the transactions of the last term; a leader whose connection is cut,
whether its lock's or its pass's, steps down."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import PartitionConfig
from gpusched.controller.events import Events
from gpusched.controller.scheduler import SchedulerLoop
from gpusched.core.model import Plan, Start
from gpusched.db import agents, jobs, submit
from gpusched.db.engine import make_engine, make_sessionmaker, psycopg_dsn
from gpusched.db.leadership import (
    APPLICATION_NAME,
    HOLDER_IDLE_TIMEOUT_MS,
    Leadership,
    NotLeader,
    check_epoch,
    current_epoch,
)
from gpusched.db.models import Job, NodeCommand
from gpusched.db.partitions import sync_partitions
from gpusched.db.schedule import apply_plan, load_snapshot
from tests.e2e.cluster import wait_for

ALICE = jobs.Identity(1000, 1000)


@pytest.fixture
def dsn(db_url: str) -> str:
    return psycopg_dsn(db_url)


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url, pool_size=4)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),))
        agents.register_node(s, {"node": "n1", "uid": 0, "gpus": [
            {"index": i, "uuid": f"GPU-{i}"} for i in range(2)]})
    yield factory
    engine.dispose()


def _submit(sessions: sessionmaker[Session]) -> int:
    with sessions() as s, s.begin():
        return submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", "gpus": 1},
                                 ALICE).id


def _apply(session: Session, job_id: int, epoch: int | None) -> set[str]:
    snapshot, node_ids = load_snapshot(session)
    return apply_plan(session, snapshot, Plan(starts=(Start(job_id, "n1", ("GPU-0",)),)),
                      node_ids, epoch)


def _launches(sessions: sessionmaker[Session]) -> list[tuple[int, int | None]]:
    with sessions() as s:
        return [(job_id, epoch) for job_id, epoch in s.execute(
            select(NodeCommand.job_id, NodeCommand.epoch).where(NodeCommand.kind == "launch")
            .order_by(NodeCommand.id))]


def _backends(dsn: str, where: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as admin:
        return [pid for (pid,) in admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            f"AND pid <> pg_backend_pid() AND {where}").fetchall()]


def _terminate(dsn: str, pids: list[int]) -> None:
    with psycopg.connect(dsn, autocommit=True) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))


def _lock_waiters(dsn: str, text: str) -> list[int]:
    """Backends waiting on a lock while running a statement containing ``text``."""
    return _backends(dsn, f"wait_event_type = 'Lock' AND query LIKE '%{text}%'")


def test_each_term_opens_the_next_epoch_and_an_ended_one_applies_nothing(
        dsn: str, sessions: sessionmaker[Session]) -> None:
    first, second = Leadership(dsn), Leadership(dsn)
    try:
        with sessions() as s:
            before = current_epoch(s)
        assert first.try_acquire() and first.epoch == before + 1
        job_id = _submit(sessions)
        _terminate(dsn, _backends(dsn, f"application_name = '{APPLICATION_NAME}'"))
        wait_for(second.try_acquire, what="the standby to lead")
        assert second.epoch == before + 2 and not first.held()
        with pytest.raises(NotLeader, match=f"epoch {before + 1} is over"):
            with sessions() as s, s.begin():
                _apply(s, job_id, before + 1)
        with sessions() as s:  # the refused plan wrote nothing
            job = s.get(Job, job_id)
            assert job is not None and job.state == "PENDING"
        assert _launches(sessions) == []
        with sessions() as s, s.begin():
            assert _apply(s, job_id, second.epoch) == {"n1"}
        assert _launches(sessions) == [(job_id, before + 2)]
        with sessions() as s:
            assert s.scalar(select(func.count()).select_from(NodeCommand)) == 1
    finally:
        first.release()
        second.release()


def test_a_new_epoch_waits_for_the_last_terms_apply(
        dsn: str, sessions: sessionmaker[Session]) -> None:
    leader, standby = Leadership(dsn), Leadership(dsn)
    job_id, late = _submit(sessions), _submit(sessions)
    try:
        assert leader.try_acquire()
        epoch = leader.epoch
        assert epoch is not None
        with sessions() as s:
            s.begin()
            check_epoch(s, epoch)  # this term's apply has begun
            leader.release()  # ... and its leader is gone meanwhile
            took = threading.Thread(target=standby.try_acquire)
            took.start()
            wait_for(lambda: _lock_waiters(dsn, "UPDATE leader"), what="the new epoch waiting")
            assert standby.epoch is None
            assert _apply(s, job_id, epoch) == {"n1"}  # the open apply still completes
            s.commit()
        took.join(timeout=20)
        assert standby.epoch == epoch + 1
        with pytest.raises(NotLeader):  # and the old term's next apply is refused
            with sessions() as s, s.begin():
                _apply(s, late, epoch)
        assert _launches(sessions) == [(job_id, epoch)]
    finally:
        leader.release()
        standby.release()


def test_a_frozen_apply_does_not_hold_up_the_next_epoch(
        dsn: str, sessions: sessionmaker[Session]) -> None:
    """A transaction holding the leader row that stops talking (its process frozen) is
    ended by PostgreSQL, and the standby's epoch goes through."""
    leader, standby = Leadership(dsn), Leadership(dsn)
    try:
        assert leader.try_acquire()
        epoch = leader.epoch
        assert epoch is not None
        with sessions() as s:
            s.begin()
            check_epoch(s, epoch)
            leader.release()
            started = time.monotonic()
            wait_for(standby.try_acquire, timeout=HOLDER_IDLE_TIMEOUT_MS / 1000 + 15,
                     what="the standby to lead")
            assert time.monotonic() - started >= HOLDER_IDLE_TIMEOUT_MS / 1000 - 1
            assert standby.epoch == epoch + 1
            with pytest.raises(DBAPIError):  # the frozen one wakes up to nothing
                _apply(s, _submit(sessions), epoch)
    finally:
        leader.release()
        standby.release()


@pytest.fixture
def loop(dsn: str, sessions: sessionmaker[Session]) -> Iterator[SchedulerLoop]:
    running = SchedulerLoop(sessions, Events(), dsn)
    running.start()
    wait_for(lambda: running.is_leader, what="the loop to lead")
    yield running
    running.stop()


def test_a_leader_whose_lock_connection_is_cut_steps_down_and_opens_a_new_term(
        dsn: str, sessions: sessionmaker[Session], loop: SchedulerLoop) -> None:
    epoch = loop.leadership.epoch
    assert epoch is not None
    _terminate(dsn, _backends(dsn, f"application_name = '{APPLICATION_NAME}'"))
    wait_for(lambda: loop.leadership.epoch == epoch + 1, what="a new term",
             seen=lambda: loop.leadership.epoch)
    job_id = _submit(sessions)
    loop.events.wake_scheduler()
    wait_for(lambda: _launches(sessions), what="a start")
    assert _launches(sessions) == [(job_id, epoch + 1)]


def test_a_pass_that_loses_its_connection_steps_down(
        dsn: str, sessions: sessionmaker[Session], loop: SchedulerLoop) -> None:
    epoch = loop.leadership.epoch
    assert epoch is not None
    with psycopg.connect(dsn) as blocker:
        # Hold the leader row so that the next pass stops at its epoch check, then cut
        # that pass's connection from under it.
        blocker.execute("SELECT epoch FROM leader WHERE id = 1 FOR UPDATE")
        job_id = _submit(sessions)
        loop.events.wake_scheduler()
        waiting = wait_for(lambda: _lock_waiters(dsn, "FOR SHARE"), what="the pass to wait")
        _terminate(dsn, waiting)
        wait_for(lambda: not loop.is_leader, what="the leader to step down")
        assert _launches(sessions) == []
        blocker.rollback()
    wait_for(lambda: _launches(sessions), what="a start in the next term")
    assert loop.leadership.epoch == epoch + 1
    assert _launches(sessions) == [(job_id, epoch + 1)]
