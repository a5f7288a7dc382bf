"""An HTTP/1.1 JSON server that knows who is calling: on the Unix socket the kernel
says (``SO_PEERCRED``); on TCP every request proves it with a credential in its
``Authorization`` header (gpusched.auth), or is answered 401 and its connection closed.

What a client may hold is bounded (admission.py): connections in all, per uid on the
Unix socket, per remote address at accept on TCP and per uid once a request proved it;
the time to send a request (the idle timeout) and the size of what it sends (wire.py).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import socket
import socketserver
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qsl

from gpusched import stages
from gpusched.controller.admission import (
    Complaints,
    OpenConnections,
    ServerLimits,
    Workers,
)
from gpusched.controller.wire import (
    RECV_BYTES,
    ClientFault,
    Connection,
    PeerGone,
    RawRequest,
    encode_answer,
    send_nowait,
)
from gpusched.errors import ConfigError, GpuschedError, Unavailable, UsageError
from gpusched.paths import claim_socket_path

if TYPE_CHECKING:
    from gpusched.auth.credential import Identity
    from gpusched.client.endpoints import Endpoint

__all__ = ["Caller", "EncodedJson", "HttpService", "Request", "Router", "ServerLimits",
           "TcpHttpServer", "UnixHttpServer", "error_body"]

log = logging.getLogger(__name__)
_PEERCRED = struct.Struct("3i")


@dataclass(frozen=True)
class Caller:
    """Who sent a request: on the Unix socket the process the kernel reports; on TCP
    the user (or node agent) its credential proves.

    ``pid``: 0 when not known (TCP). ``host``: None on the Unix socket; on TCP the host
    the credential proves (the key method's host name, munge's origin address).
    ``node``: the node a node credential proves (TCP only)."""

    pid: int
    uid: int
    gid: int
    host: str | None = None
    node: str | None = None

    @property
    def remote(self) -> bool:
        """Whether the request came over TCP."""
        return self.host is not None


@dataclass
class Request:
    """One API request, decoded."""

    method: str
    path: str
    query: dict[str, str]
    body: dict[str, Any]
    caller: Caller
    params: dict[str, str] = field(default_factory=dict)
    route: str = ""  # the pattern of the route that matched (metrics); "" while none


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
            request.route = request.route or regex.pattern  # a 405 is counted on it too
            if method == request.method:
                request.params = match.groupdict()
                return handler(request)
        if allowed:
            return 405, error_body("invalid", f"method {request.method} not allowed")
        return 404, error_body("not_found", f"no such endpoint: {request.path}")


def error_body(code: str, message: str) -> dict[str, Any]:
    """The JSON body of an error response."""
    return {"error": {"code": code, "message": message}}


class Authenticator(Protocol):
    """Checks a request's ``Authorization`` header (gpusched.auth.backends)."""

    def authenticate(self, header: str | bytes | None, now: float | None = None) -> Identity:
        """The identity the header's credential proves; a GpuschedError otherwise."""
        ...


@dataclass(frozen=True)
class Peer:
    """The other end of a connection as known at accept: the caller the kernel reports
    (Unix socket), or only a remote address (TCP)."""

    caller: Caller | None
    address: str | None = None

    @property
    def client(self) -> object:
        """What the caps and the log's rate limit count by: uid, or address."""
        return self.caller.uid if self.caller is not None else self.address

    def describe(self, caller: Caller | None = None) -> str:
        """How the log names this client."""
        if self.caller is not None:
            return f"uid {self.caller.uid} pid {self.caller.pid}"
        return f"{self.address}" + (f" (uid {caller.uid})" if caller is not None else "")


class _Refused(Exception):
    """A request answered with an error before the router, and its connection closed."""

    def __init__(self, status: int, code: str, message: str, extra: str = "") -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra


class HttpService:
    """Serves the router on connections the listeners accepted, within the limits; one
    per controller, shared by its Unix socket and its TCP listeners."""

    def __init__(self, router: Router, limits: ServerLimits | None = None,
                 authenticator: Authenticator | None = None, scheme: str = "") -> None:
        self.router = router
        self.limits = limits or ServerLimits()
        self.authenticator = authenticator
        self.scheme = scheme  # named in a 401's WWW-Authenticate
        self.connections = OpenConnections(self.limits)
        self.workers: Workers[Peer] = Workers(self.serve_connection)
        self.complaints = Complaints(log)
        # Failures of what a request needs rather than of the request (the database's
        # pool exhausted, the database unreachable): 503, one line in the log.
        self.unavailable: tuple[type[Exception], ...] = ()
        # Told of each request answered: method, route pattern ("" if none), status, seconds.
        self.observe: Callable[[str, str, int, float], None] | None = None

    def admit(self, sock: socket.socket, peer: Peer) -> None:
        """Hand the connection to a worker, or answer 503 and close it."""
        if peer.caller is not None:
            refusal = self.connections.admit_local(peer.caller.uid, sock)
        else:
            refusal = self.connections.admit_remote(str(peer.address), sock)
        if refusal is None:
            try:
                self.workers.submit(sock, peer)
                return
            except RuntimeError:  # no thread could be started
                self.connections.release(sock)
                refusal = "the controller cannot serve another connection now; try again"
        self.complaints.report(logging.WARNING, peer.client, "refused",
                               "refused a connection from %s: %s", peer.describe(), refusal)
        _refuse(sock, refusal)

    def serve_connection(self, sock: socket.socket, peer: Peer) -> None:
        """Answer the requests of one connection until it closes, errs or idles out."""
        conn = Connection(sock, self.limits.idle_timeout)
        try:
            while True:
                try:
                    raw = conn.read_request()
                    if raw is None:
                        return
                    caller = self._caller(raw, peer, sock)
                except ClientFault as fault:
                    self.complaints.report(logging.INFO, peer.client, "fault",
                                           "%s: refused a request (%d): %s", peer.describe(),
                                           fault.status, fault.message)
                    conn.send_answer(fault.status, _encode(error_body("invalid", fault.message)),
                                     close=True)
                    return
                except _Refused as refused:
                    self.complaints.report(logging.INFO, peer.client, refused.code,
                                           "%s: refused a request (%d): %s", peer.describe(),
                                           refused.status, refused.message)
                    conn.send_answer(refused.status, _encode(error_body(
                        refused.code, refused.message)), close=True, extra=refused.extra)
                    return
                if conn.peer_left():  # its answer would go nowhere: spare the work
                    raise PeerGone("closed the connection before the answer was sent",
                                   started=True)
                began = time.perf_counter()
                status, payload = self._answer(raw, caller)
                if stages.on():
                    stages.stamp("answered", method=raw.method, path=raw.target.split("?")[0],
                                 status=status, ms=(time.perf_counter() - began) * 1000)
                conn.send_answer(status, payload, close=not raw.keep_alive)
                if not raw.keep_alive:
                    return
        except PeerGone as gone:
            if gone.timed_out:
                send_nowait(sock, encode_answer(408, _encode(error_body(
                    "invalid", f"request timed out: {gone.why}")), close=True))
            if gone.started:
                self.complaints.report(logging.INFO, peer.client,
                                       "late" if gone.timed_out else "gone",
                                       "%s: %s; connection closed", peer.describe(), gone.why)
            else:
                log.debug("%s: %s; connection closed", peer.describe(), gone.why)
        except OSError as exc:
            self.complaints.report(logging.INFO, peer.client, "gone",
                                   "%s: connection error: %s", peer.describe(),
                                   exc.strerror or exc)
        finally:
            self.connections.release(sock)
            sock.close()

    def _caller(self, raw: RawRequest, peer: Peer, sock: socket.socket) -> Caller:
        """Who sent ``raw``: the kernel's word on the Unix socket (an Authorization header
        there is not read), the credential's on TCP."""
        if peer.caller is not None:
            return peer.caller
        if self.authenticator is None:  # a TCP listener is never built without one
            raise _Refused(401, "auth", "this controller takes no credentials")
        try:
            identity = self.authenticator.authenticate(raw.headers.get("authorization"))
        except GpuschedError as exc:
            extra = f"WWW-Authenticate: {self.scheme}\r\n" if exc.http_status == 401 else ""
            raise _Refused(exc.http_status, exc.code, exc.message, extra) from None
        except Exception:
            log.exception("internal error checking a credential from %s", peer.address)
            raise _Refused(500, "internal", "internal error in the controller; see its "
                                            "log") from None
        refusal = self.connections.claim(sock, identity.uid)
        if refusal is not None:
            raise _Refused(503, "unavailable", refusal)
        return Caller(0, identity.uid, identity.gid, identity.host, identity.node)

    def _answer(self, raw: RawRequest, caller: Caller) -> tuple[int, bytes]:
        """Run the request through the router; errors become status codes with a JSON body."""
        began, request = time.perf_counter(), None
        try:
            # An origin-form target, path and query: one starting "//" names no host.
            path, _, query = raw.target.partition("#")[0].partition("?")
            request = Request(method=raw.method, path=path,
                              query=dict(parse_qsl(query)), body=_json_object(raw.body),
                              caller=caller)
            status, body = self.router.dispatch(request)
        except GpuschedError as exc:
            status, body = exc.http_status, error_body(exc.code, exc.message)
        except self.unavailable as exc:
            self.complaints.report(logging.WARNING, "service", type(exc).__name__,
                                   "could not serve %s %s: %s", raw.method, raw.target[:200],
                                   str(exc).splitlines()[0][:300] if str(exc) else exc)
            status = 503
            body = error_body("unavailable", "the controller cannot serve this now (busy, "
                                             "or its database out of reach); try again")
        except Exception:
            log.exception("internal error serving %s %s", raw.method, raw.target[:200])
            status = 500
            body = error_body("internal", "internal error in the controller; see its log")
        if self.observe is not None:
            self.observe(raw.method, request.route if request is not None else "", status,
                         time.perf_counter() - began)
        return status, body.payload if isinstance(body, EncodedJson) else _encode(body)


class _Listener(socketserver.BaseServer):
    """What both listeners do at accept: pause when out of descriptors, hand each
    connection to the service."""

    service: HttpService

    def get_request(self) -> tuple[socket.socket, Any]:
        """Accept one connection; out of file descriptors, pause instead of spinning."""
        try:
            return self.socket.accept()  # type: ignore[attr-defined,no-any-return]
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self.service.complaints.report(logging.WARNING, -1, "descriptors",
                                               "cannot accept a connection: %s", exc.strerror)
                time.sleep(0.1)
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A fault of the server's own while accepting: to the log, with its traceback."""
        log.exception("error accepting a connection")

    @property
    def connections(self) -> OpenConnections:
        """The open connections of the service (all listeners)."""
        return self.service.connections

    @property
    def limits(self) -> ServerLimits:
        return self.service.limits


class UnixHttpServer(_Listener, socketserver.UnixStreamServer):
    """The local socket: the accepting thread reads the caller's credentials from the
    kernel and either hands the connection on or answers 503 with what the socket takes
    at once and closes it; it does nothing that waits on a client."""

    request_queue_size = 1024

    def __init__(self, path: Path, router: Router, mode: int = 0o666,
                 limits: ServerLimits | None = None, service: HttpService | None = None) -> None:
        self.service = service or HttpService(router, limits)
        self.router = router
        self.path = Path(path)
        _claim_socket_path(self.path)
        socketserver.UnixStreamServer.__init__(self, str(self.path),
                                               socketserver.BaseRequestHandler)
        os.chmod(self.path, mode)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Admit the connection to a worker, or answer 503 and close it."""
        sock: socket.socket = request
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        except OSError:
            sock.close()
            return
        self.service.admit(sock, Peer(Caller(*_PEERCRED.unpack(raw))))

    def server_close(self) -> None:
        super().server_close()
        self.service.connections.shut_all()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


class TcpHttpServer(_Listener, socketserver.TCPServer):
    """A TCP listener (``[controller] listen``): nothing is known of a caller at accept
    but its address, so the caps there are per address; each request must carry a
    credential the service's authenticator accepts."""

    request_queue_size = 1024
    allow_reuse_address = True  # a restarted controller binds at once (TIME_WAIT)

    def __init__(self, endpoint: Endpoint, service: HttpService) -> None:
        if service.authenticator is None:
            raise ConfigError(f"controller.listen: {endpoint}: the API over TCP needs "
                              "credentials ([auth] method 'munge' or 'key')")
        self.service = service
        self.endpoint = endpoint
        try:
            family, _, _, _, address = socket.getaddrinfo(
                endpoint.host, endpoint.port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0,
                socket.AI_PASSIVE)[0]
        except socket.gaierror as exc:
            raise ConfigError(f"controller.listen: {endpoint}: cannot resolve "
                              f"{endpoint.host}: {exc.strerror}") from None
        self.address_family = family
        socketserver.TCPServer.__init__(self, address,  # type: ignore[arg-type]
                                        socketserver.BaseRequestHandler,
                                        bind_and_activate=False)
        try:
            if family == socket.AF_INET6:  # [::] and 0.0.0.0 may then both listen
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            self.server_bind()
            self.server_activate()
        except OSError as exc:
            self.server_close()
            raise Unavailable(f"cannot listen on {endpoint}: {exc.strerror or exc}") from None

    @property
    def port(self) -> int:
        """The port listened on (the one the system chose, for port 0)."""
        return int(self.socket.getsockname()[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        """Admit the connection to a worker, or answer 503 and close it."""
        sock: socket.socket = request
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            sock.close()
            return
        self.service.admit(sock, Peer(None, str(client_address[0])))


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


def _claim_socket_path(path: Path) -> None:
    """Remove a stale socket file, refusing if a live server still answers on it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if claim_socket_path(path):
            return
    except ValueError as exc:
        raise Unavailable(str(exc)) from None
    raise Unavailable(f"another controller is already listening on {path}")
