"""What clients may hold of the API server: the caps on open connections (checked at
accept, and again once a TCP caller has proved its uid), the pool of threads that serve
them, and a log that a flood of faults cannot flood."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

P = TypeVar("P")


@dataclass(frozen=True)
class ServerLimits:
    """What clients may hold of the server (``[controller]`` in etc/gpusched.toml)."""

    idle_timeout: float = 30.0  # seconds a client may take to send a whole request
    max_connections: int = 256  # open connections of all ordinary users together
    # Per uid on the Unix socket; on TCP per remote address at accept, and per uid
    # again once a request has proved it.
    max_connections_per_user: int = 32
    # Agents and administrators: never refused, so a flood cannot cut off the nodes.
    # (Over TCP the uid is known only once a request proves it: there the caps at
    # accept hold for everyone.)
    privileged_uids: frozenset[int] = field(
        default_factory=lambda: frozenset({0, os.geteuid()}))


@dataclass
class _Entry:
    uid: int | None  # None: a TCP connection no request has proved the uid of yet
    address: str | None  # TCP: the remote address
    ordinary: bool  # counted against max_connections


class OpenConnections:
    """The open connections, by uid and by remote address; the caps are checked here."""

    def __init__(self, limits: ServerLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._entries: dict[socket.socket, _Entry] = {}
        self._by_uid: Counter[int] = Counter()
        self._by_address: Counter[str] = Counter()
        self._ordinary = 0

    def admit_local(self, uid: int, sock: socket.socket) -> str | None:
        """Count a Unix-socket connection of ``uid`` in; None, or why it is refused."""
        with self._lock:
            ordinary = uid not in self.limits.privileged_uids
            if ordinary:
                refusal = self._full() or self._over_user_cap(uid)
                if refusal:
                    return refusal
            self._add(sock, _Entry(uid, None, ordinary))
        return None

    def admit_remote(self, address: str, sock: socket.socket) -> str | None:
        """Count a TCP connection from ``address`` in; None, or why it is refused."""
        cap = self.limits.max_connections_per_user
        with self._lock:
            refusal = self._full()
            if refusal:
                return refusal
            if self._by_address[address] >= cap:
                return (f"{address} already has {cap} connections open to the controller "
                        "(the limit per address); close some and try again")
            self._add(sock, _Entry(None, address, True))
        return None

    def claim(self, sock: socket.socket, uid: int) -> str | None:
        """A request on a TCP connection proved ``uid``: count the connection as that
        uid's from now on; None, or why the uid may hold no more connections."""
        with self._lock:
            entry = self._entries.get(sock)
            if entry is None or entry.uid == uid:
                return None
            if uid not in self.limits.privileged_uids:
                refusal = self._over_user_cap(uid)
                if refusal:
                    return refusal
            if entry.uid is not None:
                self._uncount_uid(entry.uid)
            entry.uid = uid
            self._by_uid[uid] += 1
        return None

    def release(self, sock: socket.socket) -> None:
        """Count a closed connection out."""
        with self._lock:
            entry = self._entries.pop(sock, None)
            if entry is None:
                return
            if entry.ordinary:
                self._ordinary -= 1
            if entry.uid is not None:
                self._uncount_uid(entry.uid)
            if entry.address is not None:
                self._by_address[entry.address] -= 1
                if not self._by_address[entry.address]:
                    del self._by_address[entry.address]

    def count(self, uid: int | None = None) -> int:
        """Open connections of ``uid``, or of everyone."""
        with self._lock:
            return len(self._entries) if uid is None else self._by_uid.get(uid, 0)

    def count_address(self, address: str) -> int:
        """Open TCP connections from ``address``."""
        with self._lock:
            return self._by_address.get(address, 0)

    def shut_all(self) -> None:
        """Shut every open connection down, which ends its worker's wait."""
        with self._lock:
            sockets = list(self._entries)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _add(self, sock: socket.socket, entry: _Entry) -> None:
        self._entries[sock] = entry
        if entry.ordinary:
            self._ordinary += 1
        if entry.uid is not None:
            self._by_uid[entry.uid] += 1
        if entry.address is not None:
            self._by_address[entry.address] += 1

    def _uncount_uid(self, uid: int) -> None:
        self._by_uid[uid] -= 1
        if not self._by_uid[uid]:
            del self._by_uid[uid]

    def _full(self) -> str | None:
        if self._ordinary >= self.limits.max_connections:
            return (f"the controller already serves its maximum of "
                    f"{self.limits.max_connections} connections; try again shortly")
        return None

    def _over_user_cap(self, uid: int) -> str | None:
        cap = self.limits.max_connections_per_user
        if self._by_uid[uid] >= cap:
            return (f"uid {uid} already has {cap} connections open to the controller "
                    "(the limit per user); close some and try again")
        return None


class Workers(Generic[P]):
    """Threads that serve connections: one starts only when none is idle, so there are
    never more than the connections admitted. Up to KEEP_IDLE idle ones wait IDLE_EXIT
    seconds for another connection; any more leave at once, so that the threads a burst
    of connections started are gone as soon as it is served."""

    IDLE_EXIT = 60.0  # seconds an idle worker waits for another connection
    KEEP_IDLE = 8  # idle workers kept waiting

    def __init__(self, serve: Callable[[socket.socket, P], None]) -> None:
        self._serve = serve
        self._queue: queue.SimpleQueue[tuple[socket.socket, P]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # idle workers that no queued connection has claimed yet

    def submit(self, sock: socket.socket, peer: P) -> None:
        """Serve the connection on an idle worker, or on a new one."""
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._queue.put((sock, peer))
                return
        threading.Thread(target=self._run, args=(sock, peer), name="http-connection",
                         daemon=True).start()

    def _run(self, sock: socket.socket, peer: P) -> None:
        while True:
            self._serve(sock, peer)
            with self._lock:
                if self._idle >= self.KEEP_IDLE:
                    return
                self._idle += 1
            while True:
                try:
                    sock, peer = self._queue.get(timeout=self.IDLE_EXIT)
                    break
                except queue.Empty:
                    with self._lock:
                        if self._idle:  # no connection is on its way to this worker
                            self._idle -= 1
                            return


class Complaints:
    """Logs client faults at most once per client and kind every ``interval`` seconds,
    counting the lines left out, so a flood cannot flood the log."""

    def __init__(self, log: logging.Logger, interval: float = 10.0) -> None:
        self.log = log
        self.interval = interval
        self._lock = threading.Lock()
        self._last: dict[tuple[object, str], float] = {}
        self._skipped: dict[tuple[object, str], int] = {}

    def report(self, level: int, client: object, kind: str, message: str, *args: Any) -> None:
        """Log ``message`` unless this client's complaint of this kind was logged lately."""
        now = time.monotonic()
        key = (client, kind)
        with self._lock:
            if now - self._last.get(key, -self.interval) < self.interval:
                self._skipped[key] = self._skipped.get(key, 0) + 1
                return
            if len(self._last) >= 10_000:  # many clients: forget the old ones
                self._last.clear()
                self._skipped.clear()
            self._last[key] = now
            skipped = self._skipped.pop(key, 0)
        if skipped:
            message += " (and %d more like it before)"
            args = (*args, skipped)
        self.log.log(level, message, *args)
