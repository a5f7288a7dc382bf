"""The controller's API as a client sees it: JSON requests to the local Unix socket, or
over TCP to a list of controllers with a fresh credential on each request and failover.

Failover: the controllers are tried in order starting with the last one that answered.
A controller that cannot be reached, or that answers 503 (it did not act on the
request), gives way to the next; so does one that took the request and went silent or
closed the connection without a byte of answer, but only for a request that is safe to
send twice (``retry_safe``). At most ``rounds`` passes over the list, with a growing
pause between them, all within the request's timeout.
"""

from __future__ import annotations

import time
from _thread import allocate_lock

from gpusched.client import jsontext
from gpusched.client.connection import (
    HttpConnection,
    NotSent,
    TcpConnector,
    Unanswered,
    UnixConnector,
)
from gpusched.errors import (
    Conflict,
    GpuschedError,
    NotFound,
    PermissionDenied,
    Unavailable,
    UsageError,
    from_code,
)

# A user command loads none of typing, re, threading, json or pathlib through here
# (tests/cli/test_cli_imports.py): each costs a few milliseconds on every call.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path
    from types import TracebackType
    from typing import Any

    from gpusched.auth.settings import AuthConfig
    from gpusched.client.connection import Connector
    from gpusched.client.endpoints import Endpoint

ROUNDS = 3  # passes over the list of controllers for one request, at most
FIRST_PAUSE = 0.2  # seconds between the first and second pass; doubled after each
MAX_PAUSE = 2.0
# Used when a non-2xx answer carries no {"error": ...} body (a proxy, a crash page).
_BY_STATUS: dict[int, type[GpuschedError]] = {
    400: UsageError, 403: PermissionDenied, 404: NotFound, 409: Conflict, 503: Unavailable,
}
# POSTs whose effect is the same when applied twice, by path segment: "#" a number (of
# a job or command), "*" any segment (a node's name), "a|b" one of the words. Not
# listed, so never sent again once they may have been applied: a submission without a
# submit_key (a second job), signal (a second signal), requeue (a second run), samples
# (counted twice). Matched without re, which costs a CLI call about 5 ms to import.
REPEATABLE_POSTS = (
    "v1/jobs/test", "v1/jobs/#/cancel|hold|release|update", "v1/admin/apply",
    "v1/gpus/drain|resume", "v1/nodes/*/drain|resume", "agent/v1/register|health",
    "agent/v1/jobs/#/launched|ended|signalled", "agent/v1/commands/#/done",
)
_REPEATABLE = tuple(tuple(word if word in ("#", "*") else frozenset(word.split("|"))
                          for word in route.split("/")) for route in REPEATABLE_POSTS)
# The controller each list of controllers last got an answer from, for this process.
_PREFERRED: dict[tuple[str, ...], int] = {}
_PREFERRED_LOCK = allocate_lock()


def retry_safe(method: str, path: str, body: dict[str, Any] | None) -> bool:
    """Whether a request that may already have been applied can be sent again."""
    route = path.split("?", 1)[0]
    if method == "GET":
        return True
    if method != "POST":
        return False
    if route == "/v1/jobs":
        return isinstance(body, dict) and isinstance(body.get("submit_key"), str)
    if not route.startswith("/"):
        return False
    parts = route[1:].split("/")
    return any(len(parts) == len(pattern) and all(map(_segment_matches, parts, pattern))
               for pattern in _REPEATABLE)


def _segment_matches(part: str, want: str | frozenset[str]) -> bool:
    if want == "#":
        return part.isascii() and part.isdigit()
    if want == "*":
        return part != ""
    return part in want


class ApiClient:
    """Keep-alive connections to the controller (or controllers).

    ``ApiClient()`` follows the environment (gpusched.client.settings): the configured
    controllers over TCP, else the local socket. ``socket_path`` names a Unix socket;
    ``controllers`` a list to fail over between, each request carrying the header value
    ``credentials()`` returns (by default the configured [auth] method's, for this
    process's user).

    Thread-safe: one instance serialises its requests under a lock, so a thread that
    long-polls (``GET /agent/v1/work``) holds the instance for the whole wait. Give each
    thread that must not wait behind another its own instance.
    """

    def __init__(self, socket_path: str | Path | None = None, timeout: float = 30.0,
                 trusted_server_uids: frozenset[int] | None = None, *,
                 controllers: Sequence[Endpoint] | None = None,
                 credentials: Callable[[], str] | None = None,
                 rounds: int = ROUNDS) -> None:
        auth: AuthConfig | None = None
        if socket_path is None and controllers is None:
            from gpusched.client.settings import client_settings, local_socket_only

            if not local_socket_only():
                settings = client_settings()
                controllers, auth = settings.controllers or None, settings.auth
        self.timeout = timeout
        self._socket_text: str | None = None
        connectors: list[Connector]
        if controllers:
            connectors = [TcpConnector(endpoint) for endpoint in controllers]
            self.rounds = max(1, rounds)
        else:
            from gpusched.places import default_socket

            self._socket_text = str(socket_path) if socket_path is not None else default_socket()
            connectors = [UnixConnector(self._socket_text, trusted_server_uids)]
            self.rounds = 1  # the local socket: one controller, as it answers
        self.trusted_server_uids = trusted_server_uids
        self._connections = [HttpConnection(c) for c in connectors]
        self._key = tuple(c.name for c in connectors)
        self._credentials = credentials
        self._auth = auth
        self._lock = allocate_lock()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def socket_path(self) -> Path | None:
        """The Unix socket this client talks to; None when it talks to controllers over TCP."""
        if self._socket_text is None:
            return None
        from pathlib import Path

        return Path(self._socket_text)

    @property
    def local(self) -> bool:
        """Whether this client talks to the local Unix socket (``socket_path`` without
        building a Path)."""
        return self._socket_text is not None

    @property
    def connections_opened(self) -> int:
        """Connections this client has opened so far, to all its controllers."""
        return sum(connection.opened for connection in self._connections)

    @property
    def controllers(self) -> list[str]:
        """The controllers this client tries, as named in messages."""
        return list(self._key)

    def close(self) -> None:
        """Close the connections; a later request opens new ones."""
        for connection in self._connections:
            connection.close()

    def request(
        self, method: str, path: str, body: dict[str, Any] | None = None,
        timeout: float | None = None, *, repeatable: bool | None = None,
    ) -> dict[str, Any]:
        """Send one request and return the decoded JSON answer; non-2xx raises.

        ``repeatable`` overrides ``retry_safe``: whether the request may be sent again
        (to this or another controller) once it may have been applied."""
        return _decode_answer(*self._exchange(method, path, body, timeout, repeatable))

    def request_bytes(self, method: str, path: str, body: dict[str, Any] | None = None,
                      timeout: float | None = None) -> bytes:
        """``request``, returning the 2xx answer's JSON text undecoded (for a caller that
        passes it on as it is); non-2xx raises as ``request`` does."""
        status, data = self._exchange(method, path, body, timeout, None)
        if not 200 <= status < 300:
            raise _answer_error(status, data)
        return data

    def _exchange(self, method: str, path: str, body: dict[str, Any] | None,
                  timeout: float | None, repeatable: bool | None) -> tuple[int, bytes]:
        method = method.upper()
        payload = b"" if body is None else jsontext.dumps(body).encode()
        limit = self.timeout if timeout is None else timeout
        safe = retry_safe(method, path, body) if repeatable is None else repeatable
        with self._lock:
            return self._send(method, path, payload, limit, safe)

    def _send(self, method: str, path: str, payload: bytes, limit: float,
              safe: bool) -> tuple[int, bytes]:
        """The first answer a controller gives that it acted on (see the module's doc)."""
        deadline = time.monotonic() + limit
        count = len(self._connections)
        with _PREFERRED_LOCK:
            first = _PREFERRED.get(self._key, 0) % count
        failures: list[GpuschedError] = []
        pause = FIRST_PAUSE
        for round_number in range(self.rounds):
            if round_number:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                time.sleep(min(pause, left))
                pause = min(pause * 2, MAX_PAUSE)
            for step in range(count):
                index = (first + step) % count
                connection = self._connections[index]
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                message = self._message(connection, method, path, payload)
                try:
                    status, data = connection.exchange(message, left, safe)
                except NotSent as exc:
                    failures.append(exc.error)
                    continue
                except Unanswered as exc:
                    if not safe:
                        raise exc.error from None
                    failures.append(exc.error)
                    continue
                if status == 503 and count > 1:
                    failures.append(_answer_error(status, data))
                    continue
                if count > 1:
                    with _PREFERRED_LOCK:
                        _PREFERRED[self._key] = index
                return status, data
        raise _no_answer(failures, limit)

    def _message(self, connection: HttpConnection, method: str, path: str,
                 payload: bytes) -> bytes:
        authorization = None
        if connection.connector.remote:
            authorization = self._authorization()
        return _encode_request(method, path, payload, connection.name, authorization)

    def _authorization(self) -> str:
        """A fresh credential (a used one is refused as a replay)."""
        if self._credentials is None:
            from gpusched.auth.backends import credential_source

            auth = self._auth
            if auth is None:
                from gpusched.client.settings import client_settings

                auth = client_settings().auth
            source = credential_source(auth)
            if source is None:
                raise UsageError("the controllers are reached over TCP, which needs "
                                 "credentials: set [auth] method to 'munge' or 'key'")
            self._credentials = source.authorization
        return self._credentials()


def _no_answer(failures: list[GpuschedError], limit: float) -> GpuschedError:
    """The error of a request no controller answered."""
    if not failures:
        return Unavailable(f"no gpusched controller answered within {limit:g} s")
    if len(failures) == 1:
        return failures[0]
    seen = list(dict.fromkeys(f.message for f in failures))
    return Unavailable(f"no gpusched controller answered ({len(failures)} tries): "
                       + "; ".join(seen[-4:]))


def _encode_request(method: str, path: str, payload: bytes, host: str = "localhost",
                    authorization: str | None = None) -> bytes:
    """The bytes of one HTTP/1.1 request with a JSON body."""
    if not path.startswith("/") or any(c in path for c in " \r\n"):
        raise ValueError(f"bad request path {path!r}")
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: {host if '/' not in host else 'localhost'}",
        "Accept: application/json",
        f"Content-Length: {len(payload)}",
    ]
    if authorization is not None:
        if any(c in authorization for c in "\r\n"):
            raise ValueError("a credential cannot hold a line break")
        lines.append(f"Authorization: {authorization}")
    if payload:
        lines.append("Content-Type: application/json")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + payload


def _answer_error(status: int, data: bytes) -> GpuschedError:
    """The GpuschedError a non-2xx answer stands for."""
    try:
        decoded: Any = jsontext.loads(data) if data.strip() else {}
    except ValueError:
        decoded = None
    error = decoded.get("error") if isinstance(decoded, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        return from_code(error["code"], str(error.get("message", "")))
    text = data[:200].decode("utf-8", "replace").strip()
    cls = _BY_STATUS.get(status, GpuschedError)
    return cls(f"the gpusched controller answered HTTP {status}" + (f": {text}" if text else ""))


def _decode_answer(status: int, data: bytes) -> dict[str, Any]:
    """The JSON object of a 2xx answer; the matching GpuschedError otherwise."""
    if not 200 <= status < 300:
        raise _answer_error(status, data)
    try:
        decoded: Any = jsontext.loads(data) if data.strip() else {}
    except ValueError:
        decoded = None
    if not isinstance(decoded, dict):
        raise GpuschedError(f"the gpusched controller sent a non-JSON answer (status {status})")
    return decoded
