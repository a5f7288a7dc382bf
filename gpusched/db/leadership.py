"""Who may apply scheduling plans: the controller holding a PostgreSQL advisory lock on
a connection of its own, in the leadership term (epoch) it opened when it took the lock.
Everything that decides or checks leadership belongs here.

Losing the lock's connection frees the lock, so a leader that cannot reach the database
steps down and a standby takes over. A leader whose process is frozen (SIGSTOP, a
stalled host) keeps its connection open but stops using it: the connection is made to
end after ``idle_timeout`` seconds without a query (PostgreSQL's idle_session_timeout)
while a keeper thread queries it every quarter of that, so the lock outlives only a
live leader. A deposed leader that wakes up may still be in the middle of a pass: every
transaction that applies a plan or issues node commands first checks, holding the
``leader`` row (``hold_epoch``), that the epoch it holds is still the current one, and a
standby's new epoch cannot commit while such a transaction is open.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import psycopg
from sqlalchemy import text
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)
LEADER_LOCK_KEY = 0x67707573  # "gpus"
LEADER_IDLE_TIMEOUT = 6.0  # seconds a silent leader keeps the lock
APPLICATION_NAME = "gpusched leader lock"
# A transaction holding the leader row may sit idle (its process frozen) this long
# before PostgreSQL ends it, so that a new leader's epoch is not held up for ever.
HOLDER_IDLE_TIMEOUT_MS = 5000


class NotLeader(Exception):
    """The epoch this controller holds is no longer the current one (or it holds none):
    the transaction must roll back and the controller step down."""


class Leadership:
    """Holds the advisory lock on its own connection and the epoch it opened; losing
    either means stepping down."""

    def __init__(self, dsn: str, idle_timeout: float = LEADER_IDLE_TIMEOUT) -> None:
        self.dsn = dsn
        self.idle_timeout = idle_timeout
        self.epoch: int | None = None  # the term we lead, while we do
        self.since: float | None = None  # when we took it (time.time())
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()  # guards _conn and epoch
        self._keeper: threading.Thread | None = None
        self._keeper_stop = threading.Event()

    @property
    def is_held(self) -> bool:
        """True while we have the lock's connection (without asking the database)."""
        return self._conn is not None

    def try_acquire(self) -> bool:
        """Take the lock if free and open the next epoch; True while we hold it."""
        if self.held():
            return True
        try:
            conn = psycopg.connect(self.dsn, autocommit=True, application_name=APPLICATION_NAME)
        except psycopg.Error as exc:
            log.warning("cannot reach the database for leadership: %s", exc)
            return False
        try:
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK_KEY,)).fetchone()
            epoch = self._open_epoch(conn) if row and row[0] else None
        except psycopg.Error as exc:
            log.warning("cannot take the leadership lock: %s", exc)
            epoch = None
        if epoch is None:
            conn.close()
            return False
        with self._lock:
            self._conn, self.epoch, self.since = conn, epoch, time.time()
        self._start_keeper()
        log.info("became the scheduling leader (epoch %d)", epoch)
        return True

    def _open_epoch(self, conn: psycopg.Connection) -> int:
        """Bump the epoch (waiting for transactions of the last term that still hold
        the leader row) and make the connection end when its process stops using it."""
        timeout_ms = int(self.idle_timeout * 1000)
        conn.execute(f"SET lock_timeout = {timeout_ms * 2}")
        row = conn.execute(
            "UPDATE leader SET epoch = epoch + 1, holder = %s, since = now() WHERE id = 1 "
            "RETURNING epoch", (f"{socket.gethostname()}:{os.getpid()}",)).fetchone()
        if row is None:
            raise psycopg.errors.UndefinedTable("the leader row is missing: run "
                                                "'gpusched db upgrade'")
        if conn.info.server_version >= 140000:
            conn.execute(f"SET idle_session_timeout = {timeout_ms}")
        else:  # a frozen leader then keeps the lock until its TCP connection dies
            log.warning("PostgreSQL before 14 has no idle_session_timeout: a stopped "
                        "leader is replaced only once its connection breaks")
        return int(row[0])

    def held(self) -> bool:
        """True if our lock connection is alive and our epoch still the current one."""
        with self._lock:
            if self._conn is None:
                return False
            try:
                row = self._conn.execute("SELECT epoch FROM leader WHERE id = 1").fetchone()
            except psycopg.Error:
                log.warning("lost the leadership connection; stepping down")
                self._drop()
                return False
            if row is None or row[0] != self.epoch:
                log.warning("epoch %s replaced by %s; stepping down", self.epoch,
                            None if row is None else row[0])
                self._drop()
                return False
            return True

    def release(self) -> None:
        """Give up leadership (closing the connection frees the lock)."""
        with self._lock:
            self._drop()
        self._keeper_stop.set()
        keeper = self._keeper
        if keeper is not None and keeper is not threading.current_thread():
            keeper.join(timeout=5)
        self._keeper = None

    def _drop(self) -> None:
        """Close the lock connection (under ``_lock``)."""
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg.Error:
                pass
            self._conn = None
            self.epoch = self.since = None

    def _start_keeper(self) -> None:
        """Query the lock connection often enough that only a stopped process lets it
        reach its idle timeout."""
        if self._keeper is not None:
            self._keeper_stop.set()
            self._keeper.join(timeout=5)
        self._keeper_stop = threading.Event()
        stop = self._keeper_stop

        def keep() -> None:
            while not stop.wait(self.idle_timeout / 4) and self.held():
                pass

        self._keeper = threading.Thread(target=keep, name="leader-keeper", daemon=True)
        self._keeper.start()

    def hold_epoch(self, session: Session) -> int:
        """In ``session``'s transaction, hold the leader row and check that our epoch is
        the current one; the epoch, or NotLeader (roll back and step down)."""
        epoch = self.epoch
        if epoch is None:
            raise NotLeader("this controller is not the leader")
        check_epoch(session, epoch)
        return epoch


# The idle timeout for the rest of the transaction (set_config's is_local: SET LOCAL)
# and the leader row held, in one statement.
_HOLD_EPOCH = text(
    "SELECT set_config('idle_in_transaction_session_timeout', :timeout, true), "
    "(SELECT epoch FROM leader WHERE id = 1 FOR SHARE)")


def check_epoch(session: Session, epoch: int) -> None:
    """Hold the leader row for the rest of the transaction (FOR SHARE: a new leader's
    epoch waits for the commit) and raise NotLeader unless ``epoch`` is current."""
    current = session.connection().execute(
        _HOLD_EPOCH, {"timeout": str(HOLDER_IDLE_TIMEOUT_MS)}).one()[1]
    if current != epoch:
        raise NotLeader(f"epoch {epoch} is over (the current one is {current})")


def current_epoch(session: Session) -> int:
    """The epoch now in force (0 before any controller led)."""
    return int(session.execute(text("SELECT epoch FROM leader WHERE id = 1")).scalar() or 0)
