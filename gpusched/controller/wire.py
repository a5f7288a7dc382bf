"""HTTP/1.1 on one connection of the controller's socket, read within limits and a deadline.

Everything a client sends is bounded before it is kept: the head (request line and
headers) by size and count, the body by a declared ``Content-Length`` checked before a
byte of it is read, and all of it by a deadline, so that a silent or dribbling client
holds its connection for at most the idle timeout.
"""

from __future__ import annotations

import re
import select
import socket
import time
from dataclasses import dataclass
from http import HTTPStatus

MAX_BODY = 8 * 1024 * 1024
MAX_REQUEST_LINE = 65536  # a long ?ids= list fits; as the stdlib server allows
MAX_HEAD = 2 * MAX_REQUEST_LINE  # request line and every header together
MAX_HEADERS = 100
RECV_BYTES = 64 * 1024
METHODS = frozenset({"GET", "POST", "PUT", "DELETE"})

_HEAD_END = re.compile(rb"\r?\n\r?\n")
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_DIGITS = re.compile(r"^[0-9]+$")


class ClientFault(Exception):
    """A request the server refuses as sent; the answer is sent and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class PeerGone(Exception):
    """The client went away or fell silent: nothing more can be exchanged."""

    def __init__(self, why: str, started: bool, timed_out: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.started = started  # part of a request had arrived, or an answer was due
        self.timed_out = timed_out  # a request was cut off by the deadline: 408 is due


@dataclass(frozen=True)
class RawRequest:
    """One request as read off the wire."""

    method: str
    target: str
    headers: dict[str, str]  # names lower-cased; repeated headers are refused or merged
    body: bytes
    keep_alive: bool


class Connection:
    """Reads requests from and writes answers to one accepted socket."""

    def __init__(self, sock: socket.socket, idle_timeout: float) -> None:
        self.sock = sock
        self.idle_timeout = idle_timeout
        self._buffer = bytearray()

    def read_request(self) -> RawRequest | None:
        """The next request, or None when the client closed the connection between requests.

        Raises ClientFault for a request that breaks the limits and PeerGone when the
        client leaves or sends nothing (or too little) for ``idle_timeout`` seconds."""
        deadline = time.monotonic() + self.idle_timeout
        head_end = self._read_head(deadline)
        if head_end is None:
            return None
        head = bytes(self._buffer[:head_end.start()])
        del self._buffer[:head_end.end()]
        _check_head_size(head)
        method, target, version, headers = _parse_head(head)
        length = _content_length(headers)
        if headers.get("expect", "").lower() == "100-continue":
            self._send(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = self._read_body(length, deadline)
        connection = headers.get("connection", "").lower()
        keep_alive = ("close" not in connection if version == "HTTP/1.1"
                      else "keep-alive" in connection)
        return RawRequest(method, target, headers, body, keep_alive and method in METHODS)

    def peer_left(self) -> bool:
        """Whether the client has closed its end of the connection or reset it, so that
        no answer will be read: asked of the kernel, which says so even while what the
        client sent before is still unread. (A client that only shut down its sending
        side is taken as gone too, as HTTP servers commonly do.)"""
        poller = select.poll()
        poller.register(self.sock, select.POLLRDHUP)  # POLLHUP and POLLERR come anyway
        return bool(poller.poll(0))

    def send_answer(self, status: int, payload: bytes, close: bool, extra: str = "") -> None:
        """Write one JSON answer; the whole of it must go out within the idle timeout."""
        self._send(encode_answer(status, payload, close, extra))

    def _send(self, data: bytes) -> None:
        self.sock.settimeout(self.idle_timeout)
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise PeerGone("did not read the answer", started=True) from None
        except (BrokenPipeError, ConnectionResetError):
            raise PeerGone("closed the connection before the answer was sent",
                           started=True) from None

    def _read_head(self, deadline: float) -> re.Match[bytes] | None:
        """Fill the buffer up to the end of the head; None on a clean close before it."""
        scanned = 0
        while (end := _HEAD_END.search(self._buffer, max(0, scanned - 3))) is None:
            scanned = len(self._buffer)
            _check_head_size(self._buffer)
            if not self._receive(deadline, "the request head"):
                if not self._buffer:
                    return None
                raise PeerGone("closed the connection in the middle of a request", started=True)
        return end

    def _read_body(self, length: int, deadline: float) -> bytes:
        """Exactly ``length`` bytes of body, pipelined bytes after it left in the buffer."""
        while len(self._buffer) < length:
            if not self._receive(deadline, "the request body", want=length - len(self._buffer)):
                raise ClientFault(400, f"request body shorter than its Content-Length "
                                       f"({len(self._buffer)} of {length} bytes)")
        body = bytes(self._buffer[:length])
        del self._buffer[:length]
        return body

    def _receive(self, deadline: float, what: str, want: int = RECV_BYTES) -> bool:
        """Append what the client sends next; False at the end of its stream."""
        left = deadline - time.monotonic()
        started = bool(self._buffer) or what != "the request head"
        late = PeerGone(f"sent no complete request within {self.idle_timeout:g} s "
                        f"(waiting for {what})", started, timed_out=started)
        if left <= 0:
            raise late
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(min(max(want, 1), RECV_BYTES))
        except TimeoutError:
            raise late from None
        except ConnectionResetError:
            raise PeerGone("reset the connection", started) from None
        self._buffer += chunk
        return bool(chunk)


def _check_head_size(head: bytes | bytearray) -> None:
    """Refuse a head (complete or not) whose request line or whole is over the limits."""
    line_end = head.find(b"\n")
    if (line_end if line_end >= 0 else len(head)) > MAX_REQUEST_LINE:
        raise ClientFault(414, f"request line longer than {MAX_REQUEST_LINE} bytes")
    if len(head) > MAX_HEAD:
        raise ClientFault(431, f"request head longer than {MAX_HEAD} bytes")


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    """Method, target, version and headers of a request head; ClientFault if malformed."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise ClientFault(400, "request head is not ASCII") from None
    request_line, *lines = text.replace("\r\n", "\n").split("\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or not parts[1].startswith("/"):
        raise ClientFault(400, f"bad request line {request_line[:80]!r}")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise ClientFault(400, f"unsupported protocol {version[:20]!r}; expected HTTP/1.1")
    if any(c in target for c in "\r\0") or len(lines) > MAX_HEADERS:
        raise ClientFault(400, "bad request target" if len(lines) <= MAX_HEADERS
                          else f"more than {MAX_HEADERS} headers")
    headers: dict[str, str] = {}
    lengths: list[str] = []
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.match(name) or "\r" in value:
            raise ClientFault(400, f"bad header line {line[:80]!r}")
        key, value = name.lower(), value.strip(" \t")
        if key == "content-length":
            lengths.extend(v.strip(" \t") for v in value.split(","))
            continue
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if lengths:
        headers["content-length"] = _one_length(lengths)
    return method, target, version, headers


def _one_length(values: list[str]) -> str:
    """The single Content-Length of a request; one that is not a plain count is refused."""
    for value in values:
        if not _DIGITS.match(value):
            raise ClientFault(400, f"Content-Length: expected a number of bytes, got "
                                   f"{value[:40]!r}")
    counts = {v.lstrip("0") or "0" for v in values}
    if len(counts) > 1:
        raise ClientFault(400, "conflicting Content-Length values")
    count = counts.pop()
    if len(count) > len(str(MAX_BODY)):
        raise ClientFault(400, f"request body too large ({count[:40]} bytes; the limit is "
                               f"{MAX_BODY} bytes)")
    return count


def _content_length(headers: dict[str, str]) -> int:
    """The body length a request declares, checked before a byte of the body is read."""
    if "transfer-encoding" in headers:
        raise ClientFault(411, "Transfer-Encoding is not accepted; send the body with a "
                               "Content-Length")
    length = int(headers.get("content-length", "0"))
    if length > MAX_BODY:
        raise ClientFault(400, f"request body too large ({length} bytes; the limit is "
                               f"{MAX_BODY} bytes)")
    return length


def encode_answer(status: int, payload: bytes, close: bool, extra: str = "") -> bytes:
    """The bytes of one answer with a JSON body (``extra``: more header lines, each
    ending in CRLF)."""
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n{extra}"
            + ("Connection: close\r\n" if close else "") + "\r\n")
    return head.encode("ascii") + payload


def send_nowait(sock: socket.socket, data: bytes) -> None:
    """Send what the socket takes at once and no more: for a last word before closing."""
    try:
        sock.setblocking(False)
        sock.send(data)
    except OSError:
        pass
