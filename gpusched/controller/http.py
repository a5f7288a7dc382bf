"""An HTTP/1.1 JSON server on a Unix socket that knows who is calling.

Each accepted socket's caller comes straight from the kernel (``SO_PEERCRED``). What a
client may hold is bounded: connections in all and per uid (checked at accept), the
time to send a request (the idle timeout), and the size of what it sends (wire.py).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import queue
import re
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from gpusched.controller.wire import (
    RECV_BYTES,
    ClientFault,
    Connection,
    PeerGone,
    RawRequest,
    encode_answer,
    send_nowait,
)
from gpusched.errors import GpuschedError, Unavailable, UsageError

log = logging.getLogger(__name__)
_PEERCRED = struct.Struct("3i")


@dataclass(frozen=True)
class Caller:
    """The process on the other end of the socket, as the kernel reports it."""

    pid: int
    uid: int
    gid: int


@dataclass
class Request:
    """One API request, decoded."""

    method: str
    path: str
    query: dict[str, str]
    body: dict[str, Any]
    caller: Caller
    params: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EncodedJson:
    """An answer already written as JSON (by the database), sent as it is."""

    payload: bytes


Answer = tuple[int, dict[str, Any] | EncodedJson]
Handler = Callable[[Request], Answer]


class Router:
    """Maps (method, path pattern) to handlers; ``{name}`` captures a path segment."""

    def __init__(self) -> None:
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        """Register ``handler`` for ``method`` on ``pattern``."""
        regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern)
        self._routes.append((method, re.compile(f"^{regex}$"), handler))

    def dispatch(self, request: Request) -> Answer:
        """Run the matching handler; errors become status codes with a JSON body."""
        allowed = False
        for method, regex, handler in self._routes:
            match = regex.match(request.path)
            if not match:
                continue
            allowed = True
            if method == request.method:
                request.params = match.groupdict()
                return handler(request)
        if allowed:
            return 405, error_body("invalid", f"method {request.method} not allowed")
        return 404, error_body("not_found", f"no such endpoint: {request.path}")


def error_body(code: str, message: str) -> dict[str, Any]:
    """The JSON body of an error response."""
    return {"error": {"code": code, "message": message}}


class UnixHttpServer(socketserver.UnixStreamServer):
    """Accepts connections, admits them against the caps, and hands each to a worker.

    The accepting thread does nothing that waits on a client: it reads the caller's
    credentials from the kernel and either hands the connection on or answers 503 with
    what the socket takes at once and closes it."""

    request_queue_size = 1024

    def __init__(self, path: Path, router: Router, mode: int = 0o666,
                 limits: ServerLimits | None = None) -> None:
        self.router = router
        self.path = Path(path)
        self.limits = limits or ServerLimits()
        self.connections = _OpenConnections(self.limits)
        self._workers = _Workers(self._serve_connection)
        self._complaints = _Complaints()
        _claim_socket_path(self.path)
        super().__init__(str(self.path), socketserver.BaseRequestHandler)
        os.chmod(self.path, mode)

    def get_request(self) -> tuple[socket.socket, Any]:
        """Accept one connection; out of file descriptors, pause instead of spinning."""
        try:
            return self.socket.accept()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self._complaints.report(logging.WARNING, -1, "descriptors",
                                        "cannot accept a connection: %s", exc.strerror)
                time.sleep(0.1)
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        """Admit the connection to a worker, or answer 503 and close it."""
        sock: socket.socket = request
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        except OSError:
            sock.close()
            return
        caller = Caller(*_PEERCRED.unpack(raw))
        refusal = self.connections.admit(caller.uid, sock)
        if refusal is None:
            try:
                self._workers.submit(sock, caller)
                return
            except RuntimeError:  # no thread could be started
                self.connections.release(caller.uid, sock)
                refusal = "the controller cannot serve another connection now; try again"
        self._complaints.report(logging.WARNING, caller.uid, "refused",
                                "refused a connection from uid %d: %s", caller.uid, refusal)
        _refuse(sock, refusal)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A fault of the server's own while accepting: to the log, with its traceback."""
        log.exception("error accepting a connection")

    def server_close(self) -> None:
        super().server_close()
        self.connections.shut_all()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def _serve_connection(self, sock: socket.socket, caller: Caller) -> None:
        """Answer the requests of one connection until it closes, errs or idles out."""
        conn = Connection(sock, self.limits.idle_timeout)
        try:
            while True:
                try:
                    raw = conn.read_request()
                except ClientFault as fault:
                    self._complaints.report(logging.INFO, caller.uid, "fault",
                                            "uid %d pid %d: refused a request (%d): %s",
                                            caller.uid, caller.pid, fault.status,
                                            fault.message)
                    conn.send_answer(fault.status, _encode(error_body("invalid", fault.message)),
                                     close=True)
                    return
                if raw is None:
                    return
                status, payload = self._answer(raw, caller)
                conn.send_answer(status, payload, close=not raw.keep_alive)
                if not raw.keep_alive:
                    return
        except PeerGone as gone:
            if gone.timed_out:
                send_nowait(sock, encode_answer(408, _encode(error_body(
                    "invalid", f"request timed out: {gone.why}")), close=True))
            if gone.started:
                self._complaints.report(logging.INFO, caller.uid,
                                        "late" if gone.timed_out else "gone",
                                        "uid %d pid %d: %s; connection closed",
                                        caller.uid, caller.pid, gone.why)
            else:
                log.debug("uid %d pid %d: %s; connection closed", caller.uid, caller.pid,
                          gone.why)
        except OSError as exc:
            self._complaints.report(logging.INFO, caller.uid, "gone",
                                    "uid %d pid %d: connection error: %s", caller.uid,
                                    caller.pid, exc.strerror or exc)
        finally:
            self.connections.release(caller.uid, sock)
            sock.close()

    def _answer(self, raw: RawRequest, caller: Caller) -> tuple[int, bytes]:
        """Run the request through the router; errors become status codes with a JSON body."""
        try:
            url = urlsplit(raw.target)
            request = Request(method=raw.method, path=url.path,
                              query=dict(parse_qsl(url.query)), body=_json_object(raw.body),
                              caller=caller)
            status, body = self.router.dispatch(request)
        except GpuschedError as exc:
            status, body = exc.http_status, error_body(exc.code, exc.message)
        except Exception:
            log.exception("internal error serving %s %s", raw.method, raw.target[:200])
            status = 500
            body = error_body("internal", "internal error in the controller; see its log")
        return status, body.payload if isinstance(body, EncodedJson) else _encode(body)


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _json_object(data: bytes) -> dict[str, Any]:
    """A request body: nothing, or one JSON object."""
    if not data:
        return {}
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise UsageError("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise UsageError("request body must be a JSON object")
    return body


def _refuse(sock: socket.socket, message: str) -> None:
    """Answer 503 without waiting on the client, and close."""
    try:
        sock.setblocking(False)
        for _ in range(4):  # what it already sent: closing on unread bytes resets its read
            if not sock.recv(RECV_BYTES):
                break
    except OSError:
        pass
    send_nowait(sock, encode_answer(503, _encode(error_body("unavailable", message)), True))
    sock.close()


@dataclass(frozen=True)
class ServerLimits:
    """What clients may hold of the server (``[controller]`` in etc/gpusched.toml)."""

    idle_timeout: float = 30.0  # seconds a client may take to send a whole request
    max_connections: int = 256  # open connections of all ordinary users together
    max_connections_per_user: int = 32
    # Agents and administrators: never refused, so a flood cannot cut off the nodes.
    privileged_uids: frozenset[int] = field(
        default_factory=lambda: frozenset({0, os.geteuid()}))


class _OpenConnections:
    """The open connections, by uid; the caps are checked here, at accept."""

    def __init__(self, limits: ServerLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._by_uid: dict[int, int] = {}
        self._ordinary = 0
        self._sockets: set[socket.socket] = set()

    def admit(self, uid: int, sock: socket.socket) -> str | None:
        """Count the connection in; None, or why it is refused."""
        with self._lock:
            if uid not in self.limits.privileged_uids:
                if self._ordinary >= self.limits.max_connections:
                    return (f"the controller already serves its maximum of "
                            f"{self.limits.max_connections} connections; try again shortly")
                if self._by_uid.get(uid, 0) >= self.limits.max_connections_per_user:
                    return (f"uid {uid} already has {self.limits.max_connections_per_user} "
                            "connections open to the controller (the limit per user); "
                            "close some and try again")
                self._ordinary += 1
            self._by_uid[uid] = self._by_uid.get(uid, 0) + 1
            self._sockets.add(sock)
        return None

    def release(self, uid: int, sock: socket.socket) -> None:
        """Count a closed connection out."""
        with self._lock:
            if sock not in self._sockets:
                return
            self._sockets.discard(sock)
            if uid not in self.limits.privileged_uids:
                self._ordinary -= 1
            left = self._by_uid[uid] - 1
            if left:
                self._by_uid[uid] = left
            else:
                del self._by_uid[uid]

    def count(self, uid: int | None = None) -> int:
        """Open connections of ``uid``, or of everyone."""
        with self._lock:
            return len(self._sockets) if uid is None else self._by_uid.get(uid, 0)

    def shut_all(self) -> None:
        """Shut every open connection down, which ends its worker's wait."""
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Workers:
    """Threads that serve connections: one starts only when none is idle, and an idle
    one leaves after a while, so there are never more than the connections admitted."""

    IDLE_EXIT = 60.0  # seconds an idle worker waits for another connection

    def __init__(self, serve: Callable[[socket.socket, Caller], None]) -> None:
        self._serve = serve
        self._queue: queue.SimpleQueue[tuple[socket.socket, Caller]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # idle workers that no queued connection has claimed yet

    def submit(self, sock: socket.socket, caller: Caller) -> None:
        """Serve the connection on an idle worker, or on a new one."""
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._queue.put((sock, caller))
                return
        threading.Thread(target=self._run, args=(sock, caller), name="http-connection",
                         daemon=True).start()

    def _run(self, sock: socket.socket, caller: Caller) -> None:
        while True:
            self._serve(sock, caller)
            with self._lock:
                self._idle += 1
            while True:
                try:
                    sock, caller = self._queue.get(timeout=self.IDLE_EXIT)
                    break
                except queue.Empty:
                    with self._lock:
                        if self._idle:  # no connection is on its way to this worker
                            self._idle -= 1
                            return


class _Complaints:
    """Logs client faults at most once per uid and kind every ``interval`` seconds,
    counting the lines left out, so a flood cannot flood the log."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._last: dict[tuple[int, str], float] = {}
        self._skipped: dict[tuple[int, str], int] = {}

    def report(self, level: int, uid: int, kind: str, message: str, *args: Any) -> None:
        now = time.monotonic()
        key = (uid, kind)
        with self._lock:
            if now - self._last.get(key, -self.interval) < self.interval:
                self._skipped[key] = self._skipped.get(key, 0) + 1
                return
            self._last[key] = now
            skipped = self._skipped.pop(key, 0)
        if skipped:
            message += " (and %d more like it before)"
            args = (*args, skipped)
        log.log(level, message, *args)


def _claim_socket_path(path: Path) -> None:
    """Remove a stale socket file, refusing if a live server still answers on it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()
        return
    finally:
        probe.close()
    raise Unavailable(f"another controller is already listening on {path}")
