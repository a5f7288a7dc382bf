"""A threaded HTTP/1.1 JSON server on a Unix socket that knows who is calling.

The stdlib server hands each handler its connected socket, so the caller's uid comes
straight from the kernel (``SO_PEERCRED``) — the reason this stack was chosen.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import socketserver
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from gpusched.errors import GpuschedError, Unavailable, UsageError

log = logging.getLogger(__name__)
_PEERCRED = struct.Struct("3i")
MAX_BODY = 16 * 1024 * 1024


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


class _ConnectionHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: UnixHttpServer

    def setup(self) -> None:
        super().setup()
        raw = self.request.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        self.caller = Caller(*_PEERCRED.unpack(raw))

    def address_string(self) -> str:
        return f"pid {self.caller.pid} uid {self.caller.uid}"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s: %s", self.address_string(), format % args)

    def _handle(self) -> None:
        status, body = self._run()
        payload = body.payload if isinstance(body, EncodedJson) else json.dumps(
            body, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _run(self) -> Answer:
        try:
            url = urlsplit(self.path)
            request = Request(
                method=self.command, path=url.path, query=dict(parse_qsl(url.query)),
                body=self._read_body(), caller=self.caller,
            )
            return self.server.router.dispatch(request)
        except GpuschedError as exc:
            return exc.http_status, error_body(exc.code, exc.message)
        except Exception:
            log.exception("internal error serving %s %s", self.command, self.path)
            return 500, error_body("internal", "internal error in the controller; see its log")

    def _read_body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise UsageError(f"request body too large ({length} bytes)")
        if not length:
            return {}
        try:
            body = json.loads(self.rfile.read(length))
        except (ValueError, UnicodeDecodeError):
            raise UsageError("request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise UsageError("request body must be a JSON object")
        return body

    do_GET = do_POST = do_DELETE = do_PUT = _handle


class UnixHttpServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Thread-per-connection server; agents' long polls each hold one thread."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(self, path: Path, router: Router, mode: int = 0o666) -> None:
        self.router = router
        self.path = Path(path)
        _claim_socket_path(self.path)
        super().__init__(str(self.path), _ConnectionHandler)
        os.chmod(self.path, mode)

    def server_close(self) -> None:
        super().server_close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


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
