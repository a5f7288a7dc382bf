"""Who may apply scheduling plans: the controller holding a PostgreSQL advisory lock on
a connection of its own. Losing that connection frees the lock, so a leader that cannot
reach the database steps down and a standby takes over. Everything that decides or
checks leadership belongs here."""

from __future__ import annotations

import logging

import psycopg

log = logging.getLogger(__name__)
LEADER_LOCK_KEY = 0x67707573  # "gpus"


class Leadership:
    """Holds the advisory lock on its own connection; losing it means stepping down."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.Connection | None = None

    @property
    def is_held(self) -> bool:
        """True while we have the lock's connection (without asking the database)."""
        return self._conn is not None

    def try_acquire(self) -> bool:
        """Take the lock if free; True while we hold it."""
        if self.held():
            return True
        try:
            conn = psycopg.connect(self.dsn, autocommit=True)
        except psycopg.Error as exc:
            log.warning("cannot reach the database for leadership: %s", exc)
            return False
        try:
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK_KEY,)).fetchone()
        except psycopg.Error as exc:
            log.warning("cannot take the leadership lock: %s", exc)
            row = None
        if row and row[0]:
            self._conn = conn
            log.info("became the scheduling leader")
            return True
        conn.close()
        return False

    def held(self) -> bool:
        """True if our lock connection is still alive (a dead one releases the lock)."""
        if self._conn is None:
            return False
        try:
            self._conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            log.warning("lost the leadership connection; stepping down")
            self.release()
            return False

    def release(self) -> None:
        """Give up leadership (closing the connection frees the lock)."""
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg.Error:
                pass
            self._conn = None
