"""Driver connections kept for work done in one autocommit statement (a submission made
in one round trip: db/submit_known.py), apart from the engine's pool.

The pool's checkout and checkin (its events, its reset of the connection, the switch
to autocommit and back) cost as much CPU as a short statement's own driver work: a
connection here is always in autocommit and idle between uses, so none of that is
needed. At most ``size`` are open; a caller who finds none free and no room for
another does its work the ordinary way. One idle for PING_AFTER_IDLE seconds or more
is pinged before it is given out, as the pool's are (db/engine.py); one that fails is
closed and never given out again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import Engine, event

from gpusched.db.engine import PING_AFTER_IDLE


class DirectConnections:
    """Up to ``size`` autocommit connections made by ``connect``, each given to one
    caller at a time."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], size: int) -> None:
        self._connect = connect
        self.size = size
        self._idle: list[tuple[psycopg.Connection[Any], float]] = []  # and when given back
        self._open = 0
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def of(cls, engine: Engine, size: int) -> DirectConnections:
        """Connections to the engine's database, closed when the engine is disposed."""
        dsn = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        made = cls(lambda: psycopg.connect(dsn, autocommit=True), size)
        event.listen(engine, "engine_disposed", lambda _engine: made.close())
        return made

    def take(self) -> psycopg.Connection[Any] | None:
        """An idle connection (made if there is room), or None: none free and no room,
        or none could be made or answered its ping."""
        while True:
            with self._lock:
                if self._closed:
                    return None
                if self._idle:
                    conn, since = self._idle.pop()
                elif self._open < self.size:
                    self._open += 1
                    conn, since = None, 0.0
                else:
                    return None
            if conn is None:
                try:
                    return self._connect()
                except psycopg.Error:
                    self._forget()
                    return None
            if time.monotonic() - since < PING_AFTER_IDLE:
                return conn
            try:
                conn.execute("SELECT 1")  # one round trip
                return conn
            except psycopg.Error:
                self.discard(conn)  # and try the next, or a new one

    def give(self, conn: psycopg.Connection[Any]) -> None:
        """Give back a connection taken, idle again (its statement done)."""
        if conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            self.discard(conn)
            return
        with self._lock:
            if not self._closed:
                self._idle.append((conn, time.monotonic()))
                return
        self.discard(conn)

    def discard(self, conn: psycopg.Connection[Any]) -> None:
        """Close a connection taken (it failed, or is in a state not worth keeping)."""
        self._forget()
        try:
            conn.close()
        except psycopg.Error:
            pass

    def close(self) -> None:
        """Close the idle connections; those given out are closed as they come back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            self.discard(conn)

    def _forget(self) -> None:
        with self._lock:
            self._open -= 1
