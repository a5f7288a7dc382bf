"""One keep-alive HTTP/1.1 connection to one controller, over its Unix socket or TCP.

Written on ``socket`` alone: ``http.client`` costs ~30 ms to import, and the user CLIs
must start fast. It speaks only what the controller speaks (see docs/api.md): JSON
bodies, ``Content-Length`` (chunked bodies are understood too), and keep-alive.

A failed exchange says how far the request got, which decides whether it may be sent
to another controller: ``NotSent`` (nothing was applied: any request may go on) or
``Unanswered`` (the request went out and no byte of answer came back: it may have been
applied).
"""

from __future__ import annotations

import _socket

from gpusched.errors import GpuschedError, Unavailable

# The local socket is opened with _socket, the C module under ``socket``: the user
# commands then never load socket.py, which builds its enums and selectors on import
# (a few milliseconds). TCP, for remote controllers, uses socket.create_connection.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from socket import socket as Socket
    from typing import Protocol

    from gpusched.client.endpoints import Endpoint

MAX_HEAD_BYTES = 64 * 1024
RECV_BYTES = 64 * 1024
CONNECT_TIMEOUT = 5.0  # seconds to open a TCP connection, at most


class NotSent(Exception):
    """The request did not reach the controller whole: it cannot have been applied."""

    def __init__(self, error: GpuschedError) -> None:
        super().__init__(error.message)
        self.error = error


class Unanswered(Exception):
    """The request was sent but no byte of an answer came back: it may have been applied."""

    def __init__(self, error: GpuschedError) -> None:
        super().__init__(error.message)
        self.error = error


class _ConnectionLost(Exception):
    """The peer closed the connection before sending any byte of the answer."""


if TYPE_CHECKING:
    class Connector(Protocol):
        """Opens connections to one controller."""

        name: str  # how messages name the controller: a socket path or host:port
        remote: bool  # TCP: requests carry a credential

        def connect(self, timeout: float) -> Socket:
            """A new connected socket; NotSent when the controller cannot be reached."""
            ...


class UnixConnector:
    """The controller's local Unix socket; optionally only one a trusted uid serves."""

    remote = False

    def __init__(self, path: str | Path,
                 trusted_server_uids: frozenset[int] | None = None) -> None:
        self.path = path
        self.name = str(path)
        # When set, a connection whose server process (SO_PEERCRED) runs as another uid
        # is dropped before a byte is sent: whoever could bind the socket path first
        # must not hand a root agent its work.
        self.trusted_server_uids = trusted_server_uids

    def connect(self, timeout: float) -> Socket:
        sock: Socket = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)  # type: ignore[assignment]
        sock.settimeout(timeout)
        try:
            sock.connect(self.name)
        except OSError as err:
            sock.close()
            reason = err.strerror or str(err)
            raise NotSent(Unavailable(
                f"cannot reach the gpusched controller at {self.path}: {reason}; "
                "is it running? (start a local cluster with 'gpusched up')")) from None
        if self.trusted_server_uids is not None:
            server_uid = _peer_uid(sock)
            if server_uid not in self.trusted_server_uids:
                sock.close()
                trusted = ", ".join(str(u) for u in sorted(self.trusted_server_uids))
                raise NotSent(Unavailable(
                    f"refusing the gpusched controller socket {self.path}: it is served "
                    f"by uid {server_uid}, not by a trusted uid ({trusted})"))
        return sock


class TcpConnector:
    """A controller's TCP listener (``host:port``)."""

    remote = True

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.name = str(endpoint)

    def connect(self, timeout: float) -> Socket:
        import socket

        try:
            sock = socket.create_connection((self.endpoint.host, self.endpoint.port),
                                            timeout=min(timeout, CONNECT_TIMEOUT))
        except socket.gaierror as err:
            raise NotSent(Unavailable(f"cannot reach the gpusched controller at {self.name}: "
                                      f"cannot resolve {self.endpoint.host}: {err.strerror}"))
        except TimeoutError:
            raise NotSent(Unavailable(f"cannot reach the gpusched controller at {self.name}: "
                                      "no answer to the connection")) from None
        except OSError as err:
            raise NotSent(Unavailable(f"cannot reach the gpusched controller at {self.name}: "
                                      f"{err.strerror or err}")) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


class HttpConnection:
    """A keep-alive connection to the controller ``connector`` reaches; not thread-safe
    (ApiClient serialises its use)."""

    def __init__(self, connector: Connector) -> None:
        self.connector = connector
        self.name = connector.name
        self._sock: Socket | None = None
        self._buffer = bytearray()
        self.opened = 0  # connections opened so far (1 when one was kept alive throughout)

    def close(self) -> None:
        """Close the connection; a later exchange opens a new one."""
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._buffer.clear()

    def exchange(self, message: bytes, timeout: float, retry_stale: bool) -> tuple[int, bytes]:
        """One round trip. A kept-alive connection the server dropped just as the
        request went out is reconnected and the request sent again only when
        ``retry_stale`` (the request is safe to repeat)."""
        if self._sock is not None and _closed_by_peer(self._sock):
            self.close()  # nothing was sent yet, so any request may simply reconnect
        attempts = 2 if self._sock is not None and retry_stale else 1
        for _ in range(attempts):
            try:
                return self._round_trip(message, timeout)
            except _ConnectionLost:
                self.close()
        raise Unanswered(Unavailable(
            f"the gpusched controller at {self.name} closed the connection before answering"))

    def _round_trip(self, message: bytes, timeout: float) -> tuple[int, bytes]:
        """Send ``message`` on the (possibly new) connection and read the answer."""
        sock = self._connection(timeout)
        sock.settimeout(timeout)
        cut_off = False
        try:
            try:
                sock.sendall(message)
            except (BrokenPipeError, ConnectionResetError):
                # The server may have refused the request (too large, too many
                # connections) and closed before taking it all: read its reason, if it
                # sent one; with none, the request never arrived whole.
                cut_off = True
            status, headers = self._read_head(sock)
            data = self._read_body(sock, headers)
        except _ConnectionLost:
            if cut_off:
                self.close()
                raise NotSent(Unavailable(f"the gpusched controller at {self.name} closed "
                                          "the connection before taking the request")) from None
            raise
        except TimeoutError:
            started = bool(self._buffer)
            self.close()  # the answer may still arrive and would desynchronise us
            error = Unavailable(f"the gpusched controller at {self.name} did not answer "
                                f"within {round(timeout, 1):g} s")
            if started:
                raise error from None
            raise Unanswered(error) from None
        except OSError as err:
            started = bool(self._buffer)
            self.close()
            error = Unavailable(f"lost the connection to the gpusched controller at "
                                f"{self.name}: {err.strerror or err}")
            if started:
                raise error from None
            raise Unanswered(error) from None
        except BaseException:
            # Interrupted (a signal's exception, KeyboardInterrupt) between sending and
            # reading the whole answer: that answer would be taken for the next one's.
            self.close()
            raise
        if cut_off or headers.get("connection", "").lower() == "close":
            self.close()
        return status, data

    def _connection(self, timeout: float) -> Socket:
        """The open connection, or a new one."""
        if self._sock is None:
            self._sock = self.connector.connect(timeout)
            self._buffer.clear()
            self.opened += 1
        return self._sock

    def _read_head(self, sock: Socket) -> tuple[int, dict[str, str]]:
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

    def _read_body(self, sock: Socket, headers: dict[str, str]) -> bytes:
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

    def _read_chunked(self, sock: Socket) -> bytes:
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

    def _read_line(self, sock: Socket) -> bytes:
        """Read up to the next CRLF, which is consumed and not returned."""
        while (end := self._buffer.find(b"\r\n")) < 0:
            self._require(sock)
        line = self._take(end)
        del self._buffer[:2]
        return line

    def _read_exact(self, sock: Socket, count: int) -> bytes:
        """Read exactly ``count`` bytes."""
        while len(self._buffer) < count:
            self._require(sock)
        return self._take(count)

    def _require(self, sock: Socket) -> None:
        """Read more bytes; the connection ending here cuts the answer short."""
        if not self._fill(sock, lost_if_empty=False):
            raise self._protocol_error("the connection closed in the middle of the answer")

    def _take(self, count: int) -> bytes:
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        return data

    def _fill(self, sock: Socket, *, lost_if_empty: bool) -> bool:
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
        return GpuschedError(f"bad answer from the gpusched controller at {self.name}: {what}")


def _peer_uid(sock: Socket) -> int:
    """The uid of the process at the other end of a connected Unix socket."""
    import struct

    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def _closed_by_peer(sock: Socket) -> bool:
    """True when an idle keep-alive connection was closed by the server (or is unusable)."""
    timeout = sock.gettimeout()
    sock.setblocking(False)  # with a timeout set, recv would wait for data instead
    try:
        # Any byte waiting on an idle connection is a protocol error, so drop it too.
        sock.recv(1, _socket.MSG_PEEK)
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(timeout)
