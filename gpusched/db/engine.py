"""Engines and sessions."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import CursorResult, Engine, Result, create_engine
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str, pool_size: int = 10) -> Engine:
    """An engine for ``url`` with a pool sized for a threaded server."""
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        future=True,
    )


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
