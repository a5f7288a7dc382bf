"""Wake-ups between controller replicas: PostgreSQL NOTIFY on one channel.

A NOTIFY is sent inside the transaction that caused it, so other replicas hear of a
change only once it is committed. Payloads are ``sched`` (run a scheduling pass),
``node:NAME`` (the agent of NAME has work) and ``admin`` (an admin-configured table
changed; sent by a trigger, migration 0017).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
from sqlalchemy import text
from sqlalchemy.orm import Session

CHANNEL = "gpusched"
ADMIN_CHANGED = "admin"


_NOTIFY = text("SELECT pg_notify(:c, :p)")
_NOTIFY_ALL = text("SELECT pg_notify(:c, t.p) FROM unnest(CAST(:ps AS text[]))"
                   " WITH ORDINALITY AS t(p, n) ORDER BY t.n")


def notify_in(session: Session, *payloads: str) -> None:
    """Queue NOTIFYs that PostgreSQL delivers, in this order, when ``session`` commits."""
    if len(payloads) == 1:
        session.execute(_NOTIFY, {"c": CHANNEL, "p": payloads[0]})
    elif payloads:
        session.execute(_NOTIFY_ALL, {"c": CHANNEL, "ps": list(payloads)})


def open_listener(dsn: str) -> psycopg.Connection:
    """A connection of its own listening on the channel (raises ``psycopg.Error``)."""
    conn = psycopg.connect(dsn, autocommit=True)
    try:
        conn.execute(f"LISTEN {CHANNEL}")
    except psycopg.Error:
        conn.close()
        raise
    return conn


def received(conn: psycopg.Connection, timeout: float) -> Iterator[str]:
    """The payloads that arrive on ``conn`` within ``timeout`` seconds."""
    for note in conn.notifies(timeout=timeout):
        yield note.payload


def received_from(conn: psycopg.Connection, timeout: float) -> Iterator[tuple[int, str]]:
    """The notifications that arrive on ``conn`` within ``timeout`` seconds, each as the
    sending server process's pid and the payload."""
    for note in conn.notifies(timeout=timeout):
        yield note.pid, note.payload


def backend_pid(dbapi_connection: object) -> int | None:
    """The server process pid of a psycopg connection (None for another driver's)."""
    info = getattr(dbapi_connection, "info", None)
    pid = getattr(info, "backend_pid", None)
    return pid if isinstance(pid, int) else None
