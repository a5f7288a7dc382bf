"""A controller's listener skips the ``sched`` NOTIFYs its own pooled connections sent
(it woke its scheduler itself), and still acts on everyone else's, and on every
``admin`` and ``node:`` one whoever sent it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from gpusched.controller.events import Events
from gpusched.db.engine import make_engine, make_sessionmaker, psycopg_dsn
from gpusched.db.notify import notify_in


@pytest.fixture
def engines(db_url: str) -> Iterator[tuple[Engine, Engine]]:
    own, other = make_engine(db_url, pool_size=2), make_engine(db_url, pool_size=2)
    yield own, other
    own.dispose()
    other.dispose()


@pytest.fixture
def events(db_url: str, engines: tuple[Engine, Engine]) -> Iterator[Events]:
    hub = Events()
    hub.own_senders(engines[0])
    hub.listen(psycopg_dsn(db_url))
    _wait(lambda: hub.admin_generation() is not None, "the listener connected")
    yield hub
    hub.stop()


def _wait(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def _send(sessions: sessionmaker[Session], *payloads: str) -> None:
    with sessions() as session, session.begin():
        notify_in(session, *payloads)


def _heard_node(events: Events, sessions: sessionmaker[Session], name: str) -> None:
    """Send ``node:NAME`` after what was sent before and wait until it is heard: the
    listener has acted on everything committed before it."""
    seen = events.node_generation(name)
    _send(sessions, f"node:{name}")
    _wait(lambda: events.node_generation(name) != seen, f"node:{name} heard")


def test_own_sched_is_skipped_and_others_are_heard(
        engines: tuple[Engine, Engine], events: Events) -> None:
    own, other = (make_sessionmaker(e) for e in engines)
    events.scheduler.clear()
    _send(own, "sched")
    _heard_node(events, own, "mark1")  # own node wakes are still acted on
    assert not events.scheduler.is_set()

    _send(other, "sched")
    _wait(events.scheduler.is_set, "another process's sched woke the scheduler")


def test_admin_changes_from_own_connections_are_heard(
        engines: tuple[Engine, Engine], events: Events) -> None:
    own = make_sessionmaker(engines[0])
    before = events.admin_generation()
    assert before is not None
    with own() as session, session.begin():
        session.execute(text("UPDATE partitions SET max_time = max_time"))
    _wait(lambda: events.admin_generation() != before, "the admin trigger heard")


def test_a_closed_connection_is_no_longer_own(
        engines: tuple[Engine, Engine], events: Events) -> None:
    own = engines[0]
    with own.connect() as conn:
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    assert events.sent_here(pid)
    own.dispose()
    assert not events.sent_here(pid)
