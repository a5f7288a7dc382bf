"""The controller's HTTP server, run in this process on a real Unix socket: requests are
read to exactly their declared length, malformed ones are refused and closed before their
body is read, silent clients are cut off, and connections are capped per uid at accept."""

from __future__ import annotations

import errno
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpusched.client import ApiClient
from gpusched.controller.http import Request, Router, ServerLimits, UnixHttpServer
from gpusched.controller.wire import MAX_BODY, MAX_HEADERS, MAX_REQUEST_LINE
from gpusched.errors import GpuschedError, Unavailable
from tests.e2e.cluster import wait_for

ANSWER_WITHIN = 5.0  # seconds a test waits for an answer it expects


class Handlers:
    """A small router whose handlers record what reached them."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.release = threading.Event()

    def router(self) -> Router:
        r = Router()
        r.add("GET", "/v1/ping", lambda req: (200, {"ok": True, "uid": req.caller.uid}))
        r.add("POST", "/echo", self.echo)
        r.add("GET", "/wait", self.wait)
        r.add("GET", "/broken", self.broken)
        return r

    def echo(self, request: Request) -> tuple[int, dict[str, Any]]:
        self.bodies.append(request.body)
        return 200, {"body": request.body}

    def wait(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Waits server-side like an agent's long poll, without reading from the client."""
        waited = self.release.wait(float(request.query["s"]))
        return 200, {"waited": not waited}

    def broken(self, request: Request) -> tuple[int, dict[str, Any]]:
        raise RuntimeError("a bug in a handler")


@contextmanager
def serving(tmp_path: Path, handlers: Handlers, **limits: Any) -> Iterator[UnixHttpServer]:
    """A UnixHttpServer with ``limits`` serving ``handlers`` from a thread of this process."""
    server = UnixHttpServer(tmp_path / "api.sock", handlers.router(), 0o666,
                            ServerLimits(**limits))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield server
    finally:
        handlers.release.set()
        server.shutdown()
        server.server_close()
        thread.join(ANSWER_WITHIN)


@pytest.fixture
def handlers() -> Handlers:
    return Handlers()


@pytest.fixture
def server(tmp_path: Path, handlers: Handlers) -> Iterator[UnixHttpServer]:
    with serving(tmp_path, handlers) as server:
        yield server


def connect(server: UnixHttpServer) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(ANSWER_WITHIN)
    sock.connect(str(server.path))
    return sock


def send(sock: socket.socket, data: bytes) -> None:
    """Send what the server takes; it may close the connection before taking it all."""
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (fails on a timeout)."""
    data = bytearray()
    for _ in range(10_000):
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return bytes(data)
        data += chunk
    raise AssertionError(f"the server kept sending: {bytes(data[:200])!r}")


def answers(data: bytes) -> list[tuple[int, dict[str, str], Any]]:
    """The (status, headers, decoded JSON body) of each answer in ``data``, in order."""
    found = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, f"incomplete answer: {data[:200]!r}"
        status_line, *lines = head.decode("ascii").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        length = int(headers["content-length"])
        found.append((int(status_line.split(" ")[1]), headers, json.loads(rest[:length])))
        data = rest[length:]
    return found


def refused_and_closed(server: UnixHttpServer, request: bytes, status: int,
                       needle: str) -> None:
    """``request`` gets one error answer with ``status`` and the connection is closed."""
    with connect(server) as sock:
        send(sock, request)
        (got, headers, body), = answers(read_to_close(sock))
    assert got == status, body
    assert headers["connection"] == "close"
    assert body["error"]["code"] == "invalid" and needle in body["error"]["message"], body


HEAD = b"POST /echo HTTP/1.1\r\nHost: x\r\n"


@pytest.mark.parametrize(("length_headers", "needle"), [
    (b"Content-Length: -1\r\n", "expected a number of bytes, got '-1'"),
    (b"Content-Length: abc\r\n", "got 'abc'"),
    (b"Content-Length: +7\r\n", "got '+7'"),
    (b"Content-Length: 0x10\r\n", "got '0x10'"),
    (b"Content-Length: 1e3\r\n", "got '1e3'"),
    (b"Content-Length: \r\n", "got ''"),
    (b"Content-Length: " + b"9" * 5000 + b"\r\n", "request body too large"),
    (b"Content-Length: 1" + b"0" * 5000 + b"\r\n", "request body too large"),
    (b"Content-Length: 7\r\nContent-Length: 8\r\n", "conflicting Content-Length"),
    (b"Content-Length: 7, 8\r\n", "conflicting Content-Length"),
    (f"Content-Length: {MAX_BODY + 1}\r\n".encode(), "request body too large"),
    (b"Content-Length: 18446744073709551615\r\n", "request body too large"),
])
def test_a_malformed_length_is_refused_and_closed_without_reading_the_body(
        server: UnixHttpServer, handlers: Handlers, length_headers: bytes, needle: str) -> None:
    # No body follows: an answer that came before the idle timeout did not wait for one.
    refused_and_closed(server, HEAD + length_headers + b"\r\n", 400, needle)
    # And a body that does follow is not read either: the connection is closed on it.
    refused_and_closed(server, HEAD + length_headers + b"\r\n" + b"x" * 4 * 1024 * 1024,
                       400, needle)
    assert handlers.bodies == []
    wait_for(lambda: server.connections.count() == 0, ANSWER_WITHIN, "connections closed")


@pytest.mark.parametrize("encoding", [
    b"Transfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: gzip, chunked\r\n",
    b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
    b"transfer-encoding: identity\r\n",
])
def test_a_transfer_encoding_is_refused(server: UnixHttpServer, handlers: Handlers,
                                        encoding: bytes) -> None:
    chunked = b"7\r\n{\"a\":1}\r\n0\r\n\r\n"
    refused_and_closed(server, HEAD + encoding + b"\r\n" + chunked, 411, "Content-Length")
    assert handlers.bodies == []


def test_a_body_is_read_to_exactly_its_length(server: UnixHttpServer,
                                              handlers: Handlers) -> None:
    """The bytes after a body are the next request on the same connection."""
    body = b'{"a":1}'
    with connect(server) as sock:
        send(sock, HEAD + b"Content-Length: 7\r\n\r\n" + body
             + HEAD + b"Content-Length: 7\r\nContent-Length: 7\r\n\r\n" + body[:3])
        time.sleep(0.05)  # the rest of the second body comes in a later packet
        send(sock, body[3:] + b"GET /v1/ping HTTP/1.1\r\nConnection: close\r\n\r\n")
        got = answers(read_to_close(sock))
    assert [(status, content) for status, _, content in got] == [
        (200, {"body": {"a": 1}}), (200, {"body": {"a": 1}}), (200, {"ok": True, "uid": 0})]
    assert handlers.bodies == [{"a": 1}, {"a": 1}]


def test_a_body_at_the_limit_is_read(server: UnixHttpServer, handlers: Handlers) -> None:
    text = "y" * (MAX_BODY - len(json.dumps({"t": ""})))
    with ApiClient(server.path, timeout=ANSWER_WITHIN) as client:
        assert len(client.request("POST", "/echo", {"t": text})["body"]["t"]) == len(text)


def test_a_short_body_is_refused(server: UnixHttpServer, handlers: Handlers) -> None:
    with connect(server) as sock:
        send(sock, HEAD + b"Content-Length: 100\r\n\r\n{\"a\":")
        sock.shutdown(socket.SHUT_WR)
        (status, _, body), = answers(read_to_close(sock))
    assert status == 400 and "shorter than its Content-Length (5 of 100" in body["error"]["message"]
    assert handlers.bodies == []


@pytest.mark.parametrize(("request_bytes", "status", "needle"), [
    (b"GET /" + b"a" * MAX_REQUEST_LINE + b" HTTP/1.1\r\n\r\n", 414, "request line longer"),
    (b"GET /v1/ping HTTP/1.1\r\n" + b"X-A: b\r\n" * (MAX_HEADERS + 1) + b"\r\n", 400,
     f"more than {MAX_HEADERS} headers"),
    (b"GET /v1/ping HTTP/1.1\r\n" + (b"X-A: " + b"b" * 60_000 + b"\r\n") * 3, 431,
     "request head longer"),
    (b"GET /v1/ping HTTP/1.1\r\nX-A: b\r\n c\r\n\r\n", 400, "bad header line"),
    (b"GET /v1/ping HTTP/1.1\r\nX A: b\r\n\r\n", 400, "bad header line"),
    (b"GET /v1/ping HTTP/1.1\r\nX-A: b\rc\r\n\r\n", 400, "bad header line"),
    (b"GET /v1/ping HTTP/1.1\r\nX-A: \xff\r\n\r\n", 400, "not ASCII"),
    (b"GET /v1/ping HTTP/2.0\r\n\r\n", 400, "unsupported protocol"),
    (b"GET /v1/ping\r\n\r\n", 400, "bad request line"),
    (b"GET http://host/v1/ping HTTP/1.1\r\n\r\n", 400, "bad request line"),
])
def test_a_malformed_head_is_refused_and_closed(server: UnixHttpServer, request_bytes: bytes,
                                               status: int, needle: str) -> None:
    refused_and_closed(server, request_bytes, status, needle)


def test_a_silent_connection_is_closed_after_the_idle_timeout(
        tmp_path: Path, handlers: Handlers) -> None:
    with serving(tmp_path, handlers, idle_timeout=0.3) as server, connect(server) as sock:
        wait_for(lambda: server.connections.count() == 1, ANSWER_WITHIN, "connection admitted")
        assert read_to_close(sock) == b""  # nothing was asked, so nothing is answered
        wait_for(lambda: server.connections.count() == 0, ANSWER_WITHIN, "connection released")


def test_a_dribbling_client_is_cut_off_at_the_idle_timeout(
        tmp_path: Path, handlers: Handlers) -> None:
    """Each byte comes well within the timeout; the whole request does not."""
    with serving(tmp_path, handlers, idle_timeout=0.5) as server, connect(server) as sock:
        started = time.monotonic()
        sent = 0
        for byte in b"GET /v1/ping HTTP/1.1\r\nX-Slow: " + b"z" * 200:
            try:
                sock.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 1
            time.sleep(0.05)
        (status, headers, body), = answers(read_to_close(sock))
    assert sent < 200, "the server read the whole dribbled request"
    assert time.monotonic() - started < ANSWER_WITHIN + 0.5 * 2
    assert status == 408 and headers["connection"] == "close", body
    assert "within 0.5 s (waiting for the request head)" in body["error"]["message"]


def test_a_slow_body_is_cut_off_at_the_idle_timeout(tmp_path: Path, handlers: Handlers) -> None:
    with serving(tmp_path, handlers, idle_timeout=0.3) as server, connect(server) as sock:
        send(sock, HEAD + b"Content-Length: 50\r\n\r\n{\"a\":")
        (status, _, body), = answers(read_to_close(sock))
    assert status == 408 and "waiting for the request body" in body["error"]["message"]
    assert handlers.bodies == []


def test_an_idle_keep_alive_connection_is_closed_and_the_client_reconnects(
        tmp_path: Path, handlers: Handlers) -> None:
    with serving(tmp_path, handlers, idle_timeout=0.3) as server, \
            ApiClient(server.path, timeout=ANSWER_WITHIN) as client:
        assert client.request("GET", "/v1/ping")["ok"]
        wait_for(lambda: server.connections.count() == 0, ANSWER_WITHIN,
                 "idle keep-alive connection closed")
        assert client.request("POST", "/echo", {"b": 2}) == {"body": {"b": 2}}


def test_keep_alive_requests_are_answered_on_one_connection_until_it_idles_out(
        tmp_path: Path, handlers: Handlers) -> None:
    """Each request is answered on the connection it came on, which stays open (no
    Connection: close) for the next, and is closed once idle for the timeout."""
    with serving(tmp_path, handlers, idle_timeout=0.5) as server, connect(server) as sock:
        reader = sock.makefile("rb")
        for n in range(50):
            body = json.dumps({"n": n}).encode()
            send(sock, HEAD + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            status = int(reader.readline().split(b" ")[1])
            headers = {}
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("ascii").partition(":")
                headers[name.lower()] = value.strip()
            answer = json.loads(reader.read(int(headers["content-length"])))
            assert status == 200 and answer == {"body": {"n": n}}
            assert "connection" not in headers
            assert server.connections.count() == 1
        assert handlers.bodies == [{"n": n} for n in range(50)]
        assert reader.read() == b""  # idle: the server closes it
        wait_for(lambda: server.connections.count() == 0, ANSWER_WITHIN, "connection released")


def test_a_wait_on_the_server_side_is_not_cut_by_the_idle_timeout(
        tmp_path: Path, handlers: Handlers) -> None:
    """Long polls wait in the handler, not on the client: the timeout does not apply."""
    with serving(tmp_path, handlers, idle_timeout=0.2) as server, \
            ApiClient(server.path, timeout=ANSWER_WITHIN) as client:
        assert client.request("GET", "/wait?s=1.0") == {"waited": True}


def refused_at_accept(server: UnixHttpServer, needle: str, send_first: bool) -> None:
    """A connection over a cap is answered 503 and closed, whether or not it asked."""
    with connect(server) as sock:
        if send_first:
            send(sock, b"GET /v1/ping HTTP/1.1\r\n\r\n")
        (status, headers, body), = answers(read_to_close(sock))
    assert status == 503 and headers["connection"] == "close"
    assert body["error"]["code"] == "unavailable" and needle in body["error"]["message"], body


def test_connections_past_the_per_user_cap_are_refused_at_accept(
        tmp_path: Path, handlers: Handlers) -> None:
    """The test runs as root, here not exempt: the cap holds for any uid not listed."""
    with serving(tmp_path, handlers, max_connections_per_user=3,
                 privileged_uids=frozenset()) as server:
        held = [ApiClient(server.path, timeout=ANSWER_WITHIN) for _ in range(3)]
        try:
            for client in held:
                assert client.request("GET", "/v1/ping")["ok"]
            threads_before = threading.active_count()
            for i in range(40):
                refused_at_accept(server, "already has 3 connections open to the controller "
                                          "(the limit per user)", send_first=bool(i % 2))
            with ApiClient(server.path, timeout=ANSWER_WITHIN) as extra, \
                    pytest.raises(Unavailable, match="limit per user|closed the connection"):
                extra.request("GET", "/v1/ping")
            assert threading.active_count() <= threads_before  # no thread per refusal
            assert server.connections.count() == 3
            held.pop().close()
            wait_for(lambda: server.connections.count() == 2, ANSWER_WITHIN, "one released")
            with ApiClient(server.path, timeout=ANSWER_WITHIN) as again:
                assert again.request("GET", "/v1/ping")["ok"]
        finally:
            for client in held:
                client.close()


def test_connections_past_the_total_cap_are_refused(tmp_path: Path, handlers: Handlers) -> None:
    with serving(tmp_path, handlers, max_connections=2, max_connections_per_user=10,
                 privileged_uids=frozenset()) as server:
        with connect(server), connect(server):
            wait_for(lambda: server.connections.count() == 2, ANSWER_WITHIN, "two admitted")
            refused_at_accept(server, "maximum of 2 connections", send_first=False)


def test_privileged_callers_are_not_capped(tmp_path: Path, handlers: Handlers) -> None:
    """Root (the test's uid) is privileged here, as it is for the controller."""
    with serving(tmp_path, handlers, max_connections=2, max_connections_per_user=2) as server:
        clients = [ApiClient(server.path, timeout=ANSWER_WITHIN) for _ in range(6)]
        try:
            assert all(c.request("GET", "/v1/ping")["ok"] for c in clients)
            assert server.connections.count(0) == 6
        finally:
            for client in clients:
                client.close()


def test_client_faults_are_logged_once_without_a_traceback(
        tmp_path: Path, handlers: Handlers, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="gpusched.controller.http")
    with serving(tmp_path, handlers, idle_timeout=0.3) as server:
        with connect(server) as sock:  # leaves while its long poll waits
            send(sock, b"GET /wait?s=0.3 HTTP/1.1\r\n\r\n")
        with connect(server) as sock:  # sends half a request and falls silent
            send(sock, b"GET /v1/ping HTTP/1.1\r\n")
            read_to_close(sock)
        refused_and_closed(server, HEAD + b"Content-Length: -5\r\n\r\n", 400, "got '-5'")
        wait_for(lambda: server.connections.count() == 0, ANSWER_WITHIN, "all closed")
    records = [r for r in caplog.records if r.name == "gpusched.controller.http"]
    assert not [r for r in records if r.exc_info], [r.getMessage() for r in records]
    messages = [r.getMessage() for r in records]
    assert sum("closed the connection before the answer was sent" in m
               or "connection error" in m for m in messages) == 1, messages
    assert sum("within 0.3 s" in m for m in messages) == 1, messages
    assert sum("got '-5'" in m for m in messages) == 1, messages


def test_a_bug_in_a_handler_is_a_500_and_the_connection_stays_usable(
        server: UnixHttpServer) -> None:
    with ApiClient(server.path, timeout=ANSWER_WITHIN) as client:
        with pytest.raises(Exception, match="internal error in the controller"):
            client.request("GET", "/broken")
        assert client.request("GET", "/v1/ping")["ok"]


def test_running_out_of_descriptors_pauses_the_accept_loop(
        tmp_path: Path, handlers: Handlers, caplog: pytest.LogCaptureFixture) -> None:
    """accept() failing with EMFILE leaves the socket readable: the loop must not spin."""
    caplog.set_level(logging.WARNING, logger="gpusched.controller.http")
    with serving(tmp_path, handlers) as server:
        listening = server.socket
        calls: list[float] = []

        class Exhausted:
            def __getattr__(self, name: str) -> Any:
                return getattr(listening, name)

            def accept(self) -> Any:
                calls.append(time.monotonic())
                raise OSError(errno.EMFILE, "Too many open files")

        server.socket = Exhausted()  # type: ignore[assignment]
        with connect(server) as sock:
            wait_for(lambda: len(calls) >= 2, ANSWER_WITHIN, "accept tried again")
            time.sleep(0.5)  # a spinning loop would try thousands of times meanwhile
            tried = len(calls)
            server.socket = listening
            send(sock, b"GET /v1/ping HTTP/1.1\r\nConnection: close\r\n\r\n")
            (status, _, body), = answers(read_to_close(sock))
    assert tried <= 10, tried
    assert status == 200 and body["ok"]
    warnings = [r.getMessage() for r in caplog.records if "cannot accept" in r.getMessage()]
    assert len(warnings) == 1, warnings


def test_the_client_reports_the_servers_reason_for_cutting_a_body_off(
        server: UnixHttpServer, handlers: Handlers) -> None:
    # The server answers a too-large body at once and closes; the client, still
    # sending, must show that answer, not a lost connection.
    with ApiClient(server.server_address, timeout=ANSWER_WITHIN) as client:
        with pytest.raises(GpuschedError) as caught:
            client.request("POST", "/echo", {"blob": "x" * (MAX_BODY + 1024 * 1024)})
    assert "closed the connection" not in caught.value.message
    assert "request body too large" in caught.value.message
    assert handlers.bodies == []


def test_the_server_takes_no_path_that_holds_something_else(tmp_path: Path,
                                                            handlers: Handlers) -> None:
    """A stale socket is replaced; a regular file at the socket's path is refused and
    kept (the server used to remove whatever was there)."""
    path = tmp_path / "api.sock"
    path.write_text("not a socket")
    with pytest.raises(Unavailable, match="exists and is not a socket"):
        UnixHttpServer(path, handlers.router(), 0o666, ServerLimits())
    assert path.read_text() == "not a socket"
    path.unlink()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # a socket file no one serves any more
    with serving(tmp_path, handlers):
        with ApiClient(path, timeout=ANSWER_WITHIN) as client:
            assert client.request("GET", "/v1/ping")["ok"] is True
