"""A tiny HTTP/1.1 + JSON client for the controller's Unix socket.

Written on ``socket`` and ``json`` alone: ``http.client`` costs ~30 ms to import, and
the user CLIs must start fast. It speaks only what the controller speaks (see
docs/api.md): JSON bodies, ``Content-Length`` (chunked bodies are understood too), and
keep-alive.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from gpusched.errors import (
    Conflict,
    GpuschedError,
    NotFound,
    PermissionDenied,
    Unavailable,
    UsageError,
    from_code,
)
from gpusched.paths import default_socket_path

MAX_HEAD_BYTES = 64 * 1024
RECV_BYTES = 64 * 1024
# Used when a non-2xx answer carries no {"error": ...} body (a proxy, a crash page).
_BY_STATUS: dict[int, type[GpuschedError]] = {
    400: UsageError, 403: PermissionDenied, 404: NotFound, 409: Conflict, 503: Unavailable,
}


class _ConnectionLost(Exception):
    """The peer closed the connection before sending any byte of the answer."""


class ApiClient:
    """A keep-alive connection to the controller.

    Thread-safe: one instance serialises its requests under a lock, so a thread that
    long-polls (``GET /agent/v1/work``) holds the instance for the whole wait. Give each
    thread that must not wait behind another its own instance.
    """

    def __init__(self, socket_path: str | Path | None = None, timeout: float = 30.0,
                 trusted_server_uids: frozenset[int] | None = None) -> None:
        self.socket_path = Path(socket_path) if socket_path is not None else default_socket_path()
        self.timeout = timeout
        # When set, a connection whose server process (SO_PEERCRED) runs as another uid
        # is dropped before a byte is sent: whoever could bind the socket path first
        # must not hand a root agent its work.
        self.trusted_server_uids = trusted_server_uids
        self._sock: socket.socket | None = None
        self._buffer = bytearray()
        self._lock = threading.Lock()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; a later request opens a new one."""
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._buffer.clear()

    def request(
        self, method: str, path: str, body: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Send one request and return the decoded JSON answer; non-2xx raises."""
        payload = b"" if body is None else json.dumps(body).encode()
        message = _encode_request(method.upper(), path, payload)
        limit = self.timeout if timeout is None else timeout
        with self._lock:
            status, data = self._exchange(method.upper(), message, limit)
        return _decode_answer(status, data)

    def _exchange(self, method: str, message: bytes, timeout: float) -> tuple[int, bytes]:
        """One round trip, reconnecting once where that is safe."""
        if self._sock is not None and _closed_by_peer(self._sock):
            self.close()  # nothing was sent yet, so any method may simply reconnect
        # The server may still drop an idle keep-alive connection just as we send. Only
        # a GET is then repeated (once, on a new connection): a POST may have been applied.
        attempts = 2 if self._sock is not None and method == "GET" else 1
        for _ in range(attempts):
            try:
                return self._round_trip(message, timeout)
            except _ConnectionLost:
                self.close()
        raise Unavailable(
            f"the gpusched controller at {self.socket_path} closed the connection "
            "before answering"
        )

    def _round_trip(self, message: bytes, timeout: float) -> tuple[int, bytes]:
        """Send ``message`` on the (possibly new) connection and read the answer."""
        sock = self._connection()
        sock.settimeout(timeout)
        cut_off = False
        try:
            try:
                sock.sendall(message)
            except (BrokenPipeError, ConnectionResetError):
                # The server may have refused the request (too large, too many
                # connections) and closed before taking it all: read its reason, if it
                # sent one; with none, the connection was lost.
                cut_off = True
            status, headers = self._read_head(sock)
            data = self._read_body(sock, headers)
        except TimeoutError:
            self.close()  # the answer may still arrive and would desynchronise us
            raise Unavailable(
                f"the gpusched controller at {self.socket_path} did not answer within "
                f"{timeout:g} s"
            ) from None
        except _ConnectionLost:
            raise
        except OSError as err:
            self.close()
            raise Unavailable(
                f"lost the connection to the gpusched controller at {self.socket_path}: "
                f"{err.strerror or err}"
            ) from None
        if cut_off or headers.get("connection", "").lower() == "close":
            self.close()
        return status, data

    def _connection(self) -> socket.socket:
        """The open connection, or a new one."""
        if self._sock is not None:
            return self._sock
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.socket_path))
        except OSError as err:
            sock.close()
            reason = err.strerror or str(err)
            raise Unavailable(
                f"cannot reach the gpusched controller at {self.socket_path}: {reason}; "
                "is it running? (start a local cluster with 'gpusched up')"
            ) from None
        if self.trusted_server_uids is not None:
            server_uid = _peer_uid(sock)
            if server_uid not in self.trusted_server_uids:
                sock.close()
                trusted = ", ".join(str(u) for u in sorted(self.trusted_server_uids))
                raise Unavailable(
                    f"refusing the gpusched controller socket {self.socket_path}: it is served "
                    f"by uid {server_uid}, not by a trusted uid ({trusted})")
        self._sock = sock
        self._buffer.clear()
        return sock

    def _read_head(self, sock: socket.socket) -> tuple[int, dict[str, str]]:
        """Read the status line and headers; header names come back lower-cased."""
        while (end := self._buffer.find(b"\r\n\r\n")) < 0:
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise self._protocol_error("response headers are too long")
            if not self._fill(sock, lost_if_empty=True):
                raise self._protocol_error("the connection closed in the middle of the answer")
        head = bytes(self._buffer[:end]).decode("latin-1")
        del self._buffer[: end + 4]
        status_line, *header_lines = head.split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise self._protocol_error(f"bad status line {status_line[:80]!r}")
        headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if parts[0] == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
            headers["connection"] = "close"
        return int(parts[1]), headers

    def _read_body(self, sock: socket.socket, headers: dict[str, str]) -> bytes:
        """Read exactly the body the headers announce."""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return self._read_chunked(sock)
        length_text = headers.get("content-length")
        if length_text is None:
            # No length: the body runs to the end of the connection (HTTP/1.0 style).
            while self._fill(sock, lost_if_empty=False):
                pass
            headers["connection"] = "close"
            return self._take(len(self._buffer))
        if not length_text.isdigit():
            raise self._protocol_error(f"bad Content-Length {length_text!r}")
        return self._read_exact(sock, int(length_text))

    def _read_chunked(self, sock: socket.socket) -> bytes:
        """Decode a chunked body (the controller sends lengths, but be lenient)."""
        body = bytearray()
        while True:
            size_line = self._read_line(sock)
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise self._protocol_error(f"bad chunk size {size_line[:40]!r}") from None
            if size == 0:
                while self._read_line(sock):  # skip trailers up to the blank line
                    pass
                return bytes(body)
            body += self._read_exact(sock, size)
            self._read_exact(sock, 2)  # the CRLF after each chunk

    def _read_line(self, sock: socket.socket) -> bytes:
        """Read up to the next CRLF, which is consumed and not returned."""
        while (end := self._buffer.find(b"\r\n")) < 0:
            self._require(sock)
        line = self._take(end)
        del self._buffer[:2]
        return line

    def _read_exact(self, sock: socket.socket, count: int) -> bytes:
        """Read exactly ``count`` bytes."""
        while len(self._buffer) < count:
            self._require(sock)
        return self._take(count)

    def _require(self, sock: socket.socket) -> None:
        """Read more bytes; the connection ending here cuts the answer short."""
        if not self._fill(sock, lost_if_empty=False):
            raise self._protocol_error("the connection closed in the middle of the answer")

    def _take(self, count: int) -> bytes:
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        return data

    def _fill(self, sock: socket.socket, *, lost_if_empty: bool) -> bool:
        """Append what the socket has to the buffer; False at the end of the stream.

        With ``lost_if_empty``, an end or reset before the first byte of the answer is a
        lost connection (retryable), not a broken answer.
        """
        try:
            chunk = sock.recv(RECV_BYTES)
        except ConnectionResetError:
            chunk = b""
        if not chunk and lost_if_empty and not self._buffer:
            raise _ConnectionLost()
        self._buffer += chunk
        return bool(chunk)

    def _protocol_error(self, what: str) -> GpuschedError:
        self.close()
        return GpuschedError(f"bad answer from the gpusched controller at {self.socket_path}: {what}")


def _peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def _closed_by_peer(sock: socket.socket) -> bool:
    """True when an idle keep-alive connection was closed by the server (or is unusable)."""
    timeout = sock.gettimeout()
    sock.setblocking(False)  # with a timeout set, recv would wait for data instead
    try:
        # Any byte waiting on an idle connection is a protocol error, so drop it too.
        sock.recv(1, socket.MSG_PEEK)
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(timeout)


def _encode_request(method: str, path: str, payload: bytes) -> bytes:
    """The bytes of one HTTP/1.1 request with a JSON body."""
    if not path.startswith("/") or any(c in path for c in " \r\n"):
        raise ValueError(f"bad request path {path!r}")
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: localhost",
        "Accept: application/json",
        f"Content-Length: {len(payload)}",
    ]
    if payload:
        lines.append("Content-Type: application/json")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + payload


def _decode_answer(status: int, data: bytes) -> dict[str, Any]:
    """The JSON object of a 2xx answer; the matching GpuschedError otherwise."""
    try:
        decoded: Any = json.loads(data) if data.strip() else {}
    except ValueError:
        decoded = None
    if 200 <= status < 300:
        if not isinstance(decoded, dict):
            raise GpuschedError(f"the gpusched controller sent a non-JSON answer (status {status})")
        return decoded
    error = decoded.get("error") if isinstance(decoded, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        raise from_code(error["code"], str(error.get("message", "")))
    text = data[:200].decode("utf-8", "replace").strip()
    cls = _BY_STATUS.get(status, GpuschedError)
    raise cls(f"the gpusched controller answered HTTP {status}" + (f": {text}" if text else ""))
