"""Read a live cluster's database directly, for what no API shows: node commands and the
leader epoch. Read-only."""

from __future__ import annotations

from typing import Any

from sqlalchemy import create_engine, pool, text


def query(db_url: str, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    """The rows of one SELECT."""
    engine = create_engine(db_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(sql), params)]
    finally:
        engine.dispose()


def open_commands(db_url: str, kind: str | None = None) -> list[tuple[Any, ...]]:
    """(id, node, kind, job_id, run) of every command not yet done."""
    return query(db_url, "SELECT c.id, n.name, c.kind, c.job_id, c.run FROM node_commands c "
                 "JOIN nodes n ON n.id = c.node_id WHERE c.done_at IS NULL "
                 "AND (CAST(:kind AS text) IS NULL OR c.kind = :kind) ORDER BY c.id", kind=kind)


def launches(db_url: str) -> list[tuple[Any, ...]]:
    """(job_id, run, node, epoch, done) of every launch command, oldest first."""
    return query(db_url, "SELECT c.job_id, c.run, n.name, c.epoch, c.done_at IS NOT NULL "
                 "FROM node_commands c JOIN nodes n ON n.id = c.node_id "
                 "WHERE c.kind = 'launch' ORDER BY c.id")


def leader(db_url: str) -> tuple[int, str | None]:
    """The current epoch and its holder."""
    epoch, holder = query(db_url, "SELECT epoch, holder FROM leader WHERE id = 1")[0]
    return int(epoch), holder
