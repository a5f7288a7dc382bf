"""Connections kept apart from the pool for one-statement submissions (db/direct.py),
against a real PostgreSQL: bounded, reused, replaced when the server dropped them, closed
with their engine; and a submission on one whose server side died is made once, the
ordinary way."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from gpusched.db import direct as direct_module
from gpusched.db.direct import DirectConnections
from gpusched.db.engine import make_engine, psycopg_dsn
from gpusched.db.submit_known import store
from gpusched.db.submit_store import KnownFacts
from tests.db.test_submit_known import BOB, BODY, _rows, sessions  # noqa: F401  (a fixture)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    made = make_engine(db_url, pool_size=2)
    yield made
    made.dispose()


def _kill(db_url: str, conn: psycopg.Connection[object]) -> None:
    with psycopg.connect(psycopg_dsn(db_url), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 10000)", [conn.info.backend_pid])


def test_connections_are_autocommit_reused_and_bounded(engine: Engine) -> None:
    direct = DirectConnections.of(engine, 2)
    first = direct.take()
    assert first is not None and first.autocommit
    second = direct.take()
    assert second is not None and second is not first
    assert direct.take() is None  # no room for a third
    direct.give(first)
    assert direct.take() is first  # the idle one again, not a new one
    direct.discard(second)  # its room is free again
    third = direct.take()
    assert third is not None and third not in (first, second) and second.closed


def test_a_connection_left_in_a_transaction_is_not_kept(engine: Engine) -> None:
    direct = DirectConnections.of(engine, 1)
    conn = direct.take()
    assert conn is not None
    conn.autocommit = False
    conn.execute("SELECT 1")  # a transaction left open
    direct.give(conn)
    assert conn.closed
    again = direct.take()
    assert again is not None and again is not conn


def test_an_idle_connection_the_server_dropped_is_replaced(
        engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    direct = DirectConnections.of(engine, 1)
    conn = direct.take()
    assert conn is not None
    direct.give(conn)
    _kill(db_url, conn)
    monkeypatch.setattr(direct_module, "PING_AFTER_IDLE", 0.0)  # pinged at every take
    fresh = direct.take()
    assert fresh is not None and fresh is not conn and conn.closed
    assert fresh.execute("SELECT 1").fetchone() == (1,)


def test_disposing_the_engine_closes_them(engine: Engine) -> None:
    direct = DirectConnections.of(engine, 2)
    idle, out = direct.take(), direct.take()
    assert idle is not None and out is not None
    direct.give(idle)
    engine.dispose()
    assert idle.closed and direct.take() is None
    direct.give(out)  # one out at the time is closed as it comes back
    assert out.closed


def test_a_submission_on_a_dead_connection_is_made_once_the_ordinary_way(
        sessions: sessionmaker[Session], db_url: str) -> None:  # noqa: F811
    engine = sessions.kw["bind"]
    direct = DirectConnections.of(engine, 1)
    known = KnownFacts()
    store(sessions, BODY, BOB, known, direct=direct)  # the ordinary way: facts now known
    before = _rows(sessions)
    job, created = store(sessions, BODY, BOB, known, direct=direct)  # in one statement
    assert created and _rows(sessions) == before + 2  # the job and its script
    conn = direct.take()
    assert conn is not None
    direct.give(conn)
    _kill(db_url, conn)  # given back just now: not pinged
    again, created = store(sessions, {**BODY, "submit_key": "k1"}, BOB, known, direct=direct)
    assert created and again.id > job.id and _rows(sessions) == before + 4
    assert conn.closed  # discarded; the next submission makes a new one
    last, created = store(sessions, BODY, BOB, known, direct=direct)
    assert created and _rows(sessions) == before + 6
