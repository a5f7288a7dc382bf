"""Wake-ups: the scheduler on submit/cancel/job end, agents' long polls on new work.

Within one controller process a wake is a threading primitive; across replicas the
same wake travels as a PostgreSQL NOTIFY sent inside the transaction that caused it
(db/notify.py); this module relays those it hears into the process.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg
from sqlalchemy import Engine, event

from gpusched.db.notify import ADMIN_CHANGED, backend_pid, open_listener, received_from

log = logging.getLogger(__name__)

class Events:
    """The controller's wake-up hub."""

    def __init__(self) -> None:
        self.scheduler = threading.Event()
        self._nodes = threading.Condition()
        self._generation: dict[str, int] = {}
        self._stop = threading.Event()
        # Changes heard to the admin-configured tables (db/admincache.py), and whether
        # the listener is connected to hear them.
        self._admin_lock = threading.Lock()
        self._admin_generation = 0
        self._listening = False
        # Server pids of this process's own pooled connections: a ``sched`` they sent
        # was already woken here, and hearing it again would run a second, empty pass.
        self._own_lock = threading.Lock()
        self._own_pids: set[int] = set()

    def own_senders(self, engine: Engine) -> None:
        """Treat NOTIFYs sent from ``engine``'s pooled connections as this process's own."""
        event.listen(engine, "connect", self._connected)
        event.listen(engine, "close", self._closed)
        event.listen(engine, "close_detached", self._closed)
        event.listen(engine, "invalidate", self._closed)

    def _connected(self, dbapi_connection: Any, record: Any) -> None:
        pid = backend_pid(dbapi_connection)
        if pid is not None:
            with self._own_lock:
                self._own_pids.add(pid)

    def _closed(self, dbapi_connection: Any, *rest: Any) -> None:
        pid = backend_pid(dbapi_connection)
        if pid is not None:
            with self._own_lock:
                self._own_pids.discard(pid)

    def sent_here(self, pid: int) -> bool:
        """Whether server process ``pid`` is one of this process's own connections."""
        with self._own_lock:
            return pid in self._own_pids

    def wake_scheduler(self) -> None:
        """Ask the leader for a scheduling pass soon."""
        self.scheduler.set()

    def wake_node(self, name: str) -> None:
        """Release the agent of ``name`` from its long poll."""
        with self._nodes:
            self._generation[name] = self._generation.get(name, 0) + 1
            self._nodes.notify_all()

    def node_generation(self, name: str) -> int:
        """A counter that changes whenever ``name`` is woken (read before checking work)."""
        with self._nodes:
            return self._generation.get(name, 0)

    def wait_node(self, name: str, seen: int, timeout: float) -> None:
        """Wait until ``name`` is woken after generation ``seen``, or ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._nodes:
            while self._generation.get(name, 0) == seen and not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._nodes.wait(left)

    def dispatch(self, payload: str, sender: int | None = None) -> None:
        """Act on one NOTIFY payload: ``sched``, ``node:NAME`` or ``admin``. A ``sched``
        from ``sender``, a pid of this process's own connections, is skipped: every
        sender here wakes the scheduler itself. The rest are acted on whoever sent
        them (``admin`` comes from a trigger, in whichever transaction changed a table)."""
        if payload == "sched":
            if sender is None or not self.sent_here(sender):
                self.wake_scheduler()
        elif payload.startswith("node:"):
            self.wake_node(payload[5:])
        elif payload == ADMIN_CHANGED:
            self.admin_changed()

    def admin_changed(self) -> None:
        """Admin-configured tables may have changed: copies kept of them are out of date."""
        with self._admin_lock:
            self._admin_generation += 1

    def admin_generation(self) -> int | None:
        """A counter that moves whenever admin-configured tables may have changed; None
        while the listener is not connected (changes would go unheard)."""
        with self._admin_lock:
            return self._admin_generation if self._listening else None

    def _set_listening(self, listening: bool) -> None:
        # Connecting or losing the connection moves the generation too: what changed
        # while no one listened was not heard.
        with self._admin_lock:
            self._listening = listening
            self._admin_generation += 1

    def listen(self, dsn: str) -> threading.Thread:
        """Start a thread relaying NOTIFYs from other controllers into this process."""
        thread = threading.Thread(target=self._listen, args=(dsn,), name="notify", daemon=True)
        thread.start()
        return thread

    def _listen(self, dsn: str) -> None:
        while not self._stop.is_set():
            try:
                with open_listener(dsn) as conn:
                    self._set_listening(True)
                    try:
                        while not self._stop.is_set():
                            for sender, payload in received_from(conn, 1.0):
                                self.dispatch(payload, sender)
                    finally:
                        self._set_listening(False)
            except psycopg.Error as exc:
                log.warning("notification listener lost its connection: %s", exc)
                self._stop.wait(1.0)

    def stop(self) -> None:
        """Stop the listener and release every long poll."""
        self._stop.set()
        self.scheduler.set()
        with self._nodes:
            self._nodes.notify_all()
