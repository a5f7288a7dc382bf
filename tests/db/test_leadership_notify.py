"""Leadership and wake-ups against a real PostgreSQL: one leader at a time, a lost lock
connection hands leadership over, and NOTIFYs arrive only with their commit."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpusched.db.engine import make_engine, make_sessionmaker, psycopg_dsn
from gpusched.db.leadership import LEADER_LOCK_KEY, Leadership
from gpusched.db.notify import notify_in, open_listener, received


@pytest.fixture
def dsn(db_url: str) -> str:
    return psycopg_dsn(db_url)


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url, pool_size=1)
    yield make_sessionmaker(engine)
    engine.dispose()


def test_one_leader_at_a_time_and_a_lost_connection_steps_down(dsn: str) -> None:
    first, second = Leadership(dsn), Leadership(dsn)
    try:
        assert first.try_acquire() and first.is_held
        assert not second.try_acquire() and not second.is_held
        assert first.try_acquire()  # holding it already
        with psycopg.connect(dsn, autocommit=True) as admin:
            # With a timeout it returns once the backend has gone, its lock with it.
            killed = admin.execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_locks"
                " WHERE locktype = 'advisory' AND granted AND objid = %s AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())",
                (LEADER_LOCK_KEY,)).fetchall()
        assert killed == [(True,)]
        assert not first.held() and not first.is_held
        assert second.try_acquire() and second.held()
        assert not first.try_acquire()
        second.release()
        assert not second.is_held
        assert first.try_acquire()
    finally:
        first.release()
        second.release()


def _heard(conn: psycopg.Connection, want: int, deadline: float) -> list[str]:
    heard: list[str] = []
    end = time.monotonic() + deadline
    while len(heard) < want and time.monotonic() < end:
        heard.extend(received(conn, 0.2))
    return heard


def test_notifies_arrive_after_commit_and_never_after_rollback(
        dsn: str, sessions: sessionmaker[Session]) -> None:
    with open_listener(dsn) as listener:
        with sessions() as session:
            with session.begin():
                notify_in(session, "sched", "node:n1")
                assert list(received(listener, 0.3)) == []  # not before the commit
            session.begin()
            notify_in(session, "node:lost")
            session.rollback()
            with session.begin():
                notify_in(session, "node:n2")
        assert _heard(listener, 3, 10.0) == ["sched", "node:n1", "node:n2"]
        assert list(received(listener, 0.3)) == []


def test_several_notifies_of_one_call_arrive_in_their_order(
        dsn: str, sessions: sessionmaker[Session]) -> None:
    wanted = ["node:b", "sched", "node:a", "node:c", "admin"]
    with open_listener(dsn) as listener:
        with sessions() as session, session.begin():
            notify_in(session)  # nothing to send
            notify_in(session, *wanted)
        assert _heard(listener, len(wanted), 10.0) == wanted
        assert list(received(listener, 0.3)) == []
