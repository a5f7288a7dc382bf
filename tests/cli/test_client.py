"""ApiClient's wire handling against a throwaway HTTP server on a Unix socket.

The server here is deliberately dumb and scriptable (close early, answer chunked, never
answer); it stands in for nothing of ours, only for "a peer speaking HTTP/1.1".
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpusched.client import ApiClient
from gpusched.errors import (
    Conflict,
    GpuschedError,
    NotFound,
    PermissionDenied,
    Unavailable,
    UsageError,
)


@dataclass
class Seen:
    """One request as the server read it."""

    connection: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


# A reply is raw response bytes, or None to close the connection without answering.
Reply = Callable[[Seen], bytes | None]


def json_reply(status: int, obj: object, extra: str = "") -> bytes:
    """A complete HTTP/1.1 response with a JSON body and Content-Length."""
    body = json.dumps(obj).encode()
    head = (f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n")
    return head.encode() + body


def echo(seen: Seen) -> bytes:
    """Answer with what was asked, so a test can check the round trip."""
    body = json.loads(seen.body) if seen.body else None
    return json_reply(200, {"method": seen.method, "path": seen.path, "body": body,
                            "connection": seen.connection})


@dataclass
class MiniServer:
    """Thread-per-connection HTTP/1.1 server; ``reply`` decides each answer."""

    path: Path
    reply: Reply = echo
    requests: list[Seen] = field(default_factory=list)
    connections: int = 0
    closed: int = 0
    close_after_each: bool = False

    def __post_init__(self) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        self.listener.listen(16)
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                number = self.connections
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        reader = conn.makefile("rb")
        with conn, reader:
            self._converse(conn, reader, number)
        with self.lock:
            self.closed += 1

    def _converse(self, conn: socket.socket, reader: object, number: int) -> None:
        while True:
            seen = self._read_request(reader, number)
            if seen is None:
                return
            with self.lock:
                self.requests.append(seen)
            answer = self.reply(seen)
            if answer is None:
                return
            try:
                conn.sendall(answer)
            except (BrokenPipeError, ConnectionResetError):
                return  # the client gave up on this connection
            if self.close_after_each:
                return

    @staticmethod
    def _read_request(reader: object, number: int) -> Seen | None:
        assert hasattr(reader, "readline") and hasattr(reader, "read")
        line = reader.readline()
        if not line:
            return None
        method, path, _ = line.decode().split(" ", 2)
        headers: dict[str, str] = {}
        while (header := reader.readline()) not in (b"\r\n", b""):
            name, _, value = header.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        body = reader.read(int(headers.get("content-length", "0")))
        return Seen(number, method, path, headers, body)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory: AF_UNIX paths are limited to 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def server(sock_dir: Path) -> Iterator[MiniServer]:
    srv = MiniServer(sock_dir / "c.sock")
    yield srv
    srv.close()


def test_json_round_trip(server: MiniServer) -> None:
    with ApiClient(server.path) as client:
        answer = client.request("POST", "/v1/jobs", {"script": "#!/bin/sh\n", "gpus": 2})
    assert answer["method"] == "POST" and answer["path"] == "/v1/jobs"
    assert answer["body"] == {"script": "#!/bin/sh\n", "gpus": 2}
    seen = server.requests[0]
    assert seen.headers["content-length"] == str(len(seen.body))
    assert seen.headers["content-type"] == "application/json"
    assert seen.headers["host"]  # HTTP/1.1 requires it


def test_get_sends_no_body_but_a_zero_length(server: MiniServer) -> None:
    with ApiClient(server.path) as client:
        assert client.request("GET", "/v1/jobs?all=1")["path"] == "/v1/jobs?all=1"
    assert server.requests[0].headers["content-length"] == "0"
    assert server.requests[0].body == b""


@pytest.mark.parametrize(
    ("status", "code", "error_type"),
    [
        (400, "invalid", UsageError),
        (403, "forbidden", PermissionDenied),
        (404, "not_found", NotFound),
        (409, "conflict", Conflict),
        (503, "unavailable", Unavailable),
        (500, "internal", GpuschedError),
    ],
)
def test_error_body_becomes_its_error_class(
    server: MiniServer, status: int, code: str, error_type: type[GpuschedError],
) -> None:
    server.reply = lambda seen: json_reply(status, {"error": {"code": code, "message": "boom"}})
    with ApiClient(server.path) as client, pytest.raises(error_type) as caught:
        client.request("POST", "/v1/jobs/3/cancel")
    assert type(caught.value) is error_type
    assert caught.value.message == "boom"


def test_usage_errors_from_the_controller_exit_2_others_1(server: MiniServer) -> None:
    server.reply = lambda seen: json_reply(400, {"error": {"code": "invalid", "message": "x"}})
    with ApiClient(server.path) as client, pytest.raises(GpuschedError) as caught:
        client.request("GET", "/v1/ping")
    assert caught.value.exit_code == 2


def test_error_without_json_body_is_mapped_by_status(server: MiniServer) -> None:
    server.reply = lambda seen: b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot here\n"
    with ApiClient(server.path) as client, pytest.raises(NotFound, match="HTTP 404: not here"):
        client.request("GET", "/nowhere")


def test_non_json_success_is_an_error(server: MiniServer) -> None:
    server.reply = lambda seen: b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    with ApiClient(server.path) as client, pytest.raises(GpuschedError, match="non-JSON"):
        client.request("GET", "/v1/ping")


def test_keep_alive_reuses_one_connection(server: MiniServer) -> None:
    with ApiClient(server.path) as client:
        answers = [client.request("GET", f"/v1/jobs/{i}") for i in range(5)]
    assert [a["path"] for a in answers] == [f"/v1/jobs/{i}" for i in range(5)]
    assert server.connections == 1 and len(server.requests) == 5


def wait_closed(server: MiniServer, count: int) -> None:
    """Wait (with a deadline) until the server has closed ``count`` connections."""
    deadline = time.monotonic() + 5
    while server.closed < count:
        assert time.monotonic() < deadline, f"server closed {server.closed} connections, not {count}"
        time.sleep(0.005)


def test_reconnects_when_the_server_closed_an_idle_connection(server: MiniServer) -> None:
    server.close_after_each = True  # closed right after answering, with no warning
    with ApiClient(server.path) as client:
        first = client.request("GET", "/a")
        wait_closed(server, 1)
        # The close is seen before sending, so even a POST may safely reconnect.
        second = client.request("POST", "/b", {"n": 1})
        wait_closed(server, 2)
        third = client.request("GET", "/c")
    assert (first["connection"], second["connection"], third["connection"]) == (1, 2, 3)
    assert [s.path for s in server.requests] == ["/a", "/b", "/c"]


def _drop_second_request_on_each_connection(seen: Seen) -> bytes | None:
    return None if seen.path.endswith("/again") and seen.connection == 1 else echo(seen)


def test_get_is_retried_once_when_the_connection_dies_after_sending(server: MiniServer) -> None:
    server.reply = _drop_second_request_on_each_connection
    with ApiClient(server.path) as client:
        client.request("GET", "/first")
        answer = client.request("GET", "/again")
    assert answer["connection"] == 2
    assert [(s.connection, s.path) for s in server.requests] == [
        (1, "/first"), (1, "/again"), (2, "/again")]


def test_post_is_not_retried_when_the_connection_dies_after_sending(server: MiniServer) -> None:
    server.reply = _drop_second_request_on_each_connection
    with ApiClient(server.path) as client:
        client.request("GET", "/first")
        with pytest.raises(Unavailable, match="closed the connection before answering"):
            client.request("POST", "/again", {"x": 1})
        # The client recovers: the next request opens a fresh connection.
        assert client.request("GET", "/later")["connection"] == 2
    assert [s.path for s in server.requests].count("/again") == 1


def test_a_fresh_connection_closed_without_answer_is_not_retried(server: MiniServer) -> None:
    server.reply = lambda seen: None
    with ApiClient(server.path) as client, pytest.raises(Unavailable):
        client.request("GET", "/v1/ping")
    assert len(server.requests) == 1


def test_chunked_answer_is_decoded(server: MiniServer) -> None:
    body = json.dumps({"jobs": [1, 2, 3]}).encode()
    chunks = b"".join(f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in (body[:5], body[5:]))
    server.reply = lambda seen: (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 + chunks + b"0\r\n\r\n")
    with ApiClient(server.path) as client:
        assert client.request("GET", "/v1/jobs") == {"jobs": [1, 2, 3]}
        assert client.request("GET", "/v1/jobs") == {"jobs": [1, 2, 3]}
    assert server.connections == 1  # the chunked body was consumed exactly


def test_connection_close_header_is_honoured(server: MiniServer) -> None:
    server.reply = lambda seen: json_reply(200, {"n": seen.connection}, "Connection: close\r\n")
    with ApiClient(server.path) as client:
        assert [client.request("POST", "/x")["n"] for _ in range(2)] == [1, 2]


def test_missing_socket_is_unavailable_with_a_hint(sock_dir: Path) -> None:
    path = sock_dir / "absent.sock"
    with ApiClient(path) as client, pytest.raises(Unavailable) as caught:
        client.request("GET", "/v1/ping")
    assert caught.value.message == (
        f"cannot reach the gpusched controller at {path}: No such file or directory; "
        "is it running? (start a local cluster with 'gpusched up')")


def test_socket_without_listener_is_connection_refused(sock_dir: Path) -> None:
    path = sock_dir / "stale.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))  # a socket file nobody listens on, as after a crash
    stale.close()
    with ApiClient(path) as client, pytest.raises(Unavailable, match="Connection refused; is it running"):
        client.request("GET", "/v1/ping")


def test_silent_server_times_out(server: MiniServer) -> None:
    release = threading.Event()

    def never(seen: Seen) -> bytes | None:
        release.wait(10)
        return None

    server.reply = never
    try:
        with ApiClient(server.path) as client, pytest.raises(Unavailable, match="did not answer within 0.2 s"):
            client.request("GET", "/agent/v1/work?wait=30", timeout=0.2)
    finally:
        release.set()


def test_socket_path_defaults_to_gpusched_socket(monkeypatch: pytest.MonkeyPatch, sock_dir: Path) -> None:
    monkeypatch.setenv("GPUSCHED_SOCKET", str(sock_dir / "env.sock"))
    assert ApiClient().socket_path == sock_dir / "env.sock"


def test_one_instance_is_safe_to_share_between_threads(server: MiniServer) -> None:
    results: dict[int, object] = {}
    with ApiClient(server.path) as client:
        def ask(n: int) -> None:
            results[n] = client.request("POST", f"/t/{n}", {"n": n})["body"]

        threads = [threading.Thread(target=ask, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
    assert results == {n: {"n": n} for n in range(8)}
    assert server.connections == 1


class _Interrupted(BaseException):
    """What a signal handler raises in the middle of a request (as the agent's stop)."""


def test_a_request_interrupted_before_its_answer_does_not_answer_the_next(
        server: MiniServer) -> None:
    def late(seen: Seen) -> bytes:
        if seen.path == "/slow":
            time.sleep(0.4)  # the answer comes after the interruption
        return echo(seen)

    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted()

    server.reply = late
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with ApiClient(server.path) as client:
            signal.setitimer(signal.ITIMER_REAL, 0.1)
            with pytest.raises(_Interrupted):
                client.request("GET", "/slow")
            # Sent before the slow answer comes: on that connection, it would be read
            # as this request's.
            answer = client.request("POST", "/next", {"n": 1})
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert answer["path"] == "/next" and answer["body"] == {"n": 1}
    assert answer["connection"] == 2  # the interrupted one was dropped
