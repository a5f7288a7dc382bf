"""Engines and sessions."""

from __future__ import annotations

import time
from typing import Any, cast

from sqlalchemy import CursorResult, Engine, Result, create_engine, event, exc
from sqlalchemy.orm import Session, sessionmaker

# A pooled connection given back this recently is taken again without a ping first.
PING_AFTER_IDLE = 1.0


def make_engine(url: str, pool_size: int = 10) -> Engine:
    """An engine for ``url`` with a pool sized for a threaded server.

    A connection taken from the pool after lying idle for PING_AFTER_IDLE seconds or
    more is pinged first, and replaced if PostgreSQL no longer answers on it (a restart,
    a failover); one given back less than that ago is not, which spares a busy server a
    round trip per request."""
    engine = create_engine(url, pool_size=pool_size, max_overflow=pool_size, future=True)
    dialect = engine.dialect

    def ping_if_idle(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        since = record.info.get("idle_since")
        if since is not None and time.monotonic() - since < PING_AFTER_IDLE:
            return
        try:
            dialect.do_ping(dbapi_connection)  # outside any transaction: one round trip
        except Exception as error:  # any failure: a connection not worth keeping
            raise exc.DisconnectionError(
                f"a pooled connection no longer answers: {error}") from error

    event.listen(engine.pool, "checkin", _note_idle)
    event.listen(engine.pool, "checkout", ping_if_idle)
    return engine


def _note_idle(dbapi_connection: Any, record: Any) -> None:
    record.info["idle_since"] = time.monotonic()


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded objects usable after commit."""
    return sessionmaker(engine, expire_on_commit=False)


def driver(session: Session) -> Any:
    """The driver's (psycopg's) connection of the session's transaction, after what the
    session holds is written (as an ORM query would, when the session autoflushes). A
    statement of plain SQL run on it costs a fraction of the CPU of an ORM or Core one,
    which builds, caches and synchronises what it runs: for the few that every job
    makes."""
    if session.autoflush:
        session.flush()
    return session.connection().connection.driver_connection


def rowcount(result: Result[Any]) -> int:
    """Rows an UPDATE matched: how a guarded transition tells whether it happened."""
    return cast(CursorResult[Any], result).rowcount


def psycopg_dsn(url: str) -> str:
    """The libpq connection string psycopg wants for a SQLAlchemy URL."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
