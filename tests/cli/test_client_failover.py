"""ApiClient over TCP against throwaway scriptable HTTP servers on 127.0.0.1: a fresh
credential on each request, and failover between controllers (what moves on to the
next, what is never sent twice, how far it goes)."""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpusched.client import ApiClient
from gpusched.client.api import retry_safe
from gpusched.client.endpoints import Endpoint
from gpusched.client.settings import client_settings
from gpusched.errors import AuthError, ConfigError, Unavailable
from tests.cli.test_client import Seen, echo, json_reply

Reply = Callable[[Seen], bytes | None]


class TcpServer:
    """Thread-per-connection HTTP/1.1 server on 127.0.0.1; ``reply`` decides each answer
    (None: close without answering)."""

    def __init__(self, reply: Reply = echo) -> None:
        self.reply = reply
        self.requests: list[Seen] = []
        self.lock = threading.Lock()
        self.connections = 0
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.endpoint = Endpoint("127.0.0.1", self.listener.getsockname()[1])
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
            while True:
                line = reader.readline()
                if not line:
                    return
                method, path, _ = line.decode().split(" ", 2)
                headers: dict[str, str] = {}
                while (header := reader.readline()) not in (b"\r\n", b""):
                    name, _, value = header.decode().partition(":")
                    headers[name.strip().lower()] = value.strip()
                seen = Seen(number, method, path, headers,
                            reader.read(int(headers.get("content-length", "0"))))
                with self.lock:
                    self.requests.append(seen)
                answer = self.reply(seen)
                if answer is None:
                    return
                conn.sendall(answer)

    @property
    def paths(self) -> list[str]:
        with self.lock:
            return [s.path for s in self.requests]

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def servers() -> Iterator[list[TcpServer]]:
    made = [TcpServer(), TcpServer()]
    yield made
    for server in made:
        server.close()


def closed_port() -> Endpoint:
    """An address where nothing listens: connections are refused."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return Endpoint("127.0.0.1", port)


def credentials() -> Callable[[], str]:
    numbers = itertools.count(1)
    return lambda: f"GPUSCHED-KEY token-{next(numbers)}"


def client(*endpoints: Endpoint, timeout: float = 5.0) -> ApiClient:
    return ApiClient(controllers=endpoints, credentials=credentials(), timeout=timeout)


def unavailable(seen: Seen) -> bytes:
    return json_reply(503, {"error": {"code": "unavailable", "message": "busy"}})


def test_each_request_carries_a_fresh_credential(servers: list[TcpServer]) -> None:
    with client(servers[0].endpoint) as c:
        for i in range(3):
            assert c.request("GET", f"/v1/jobs/{i}")["path"] == f"/v1/jobs/{i}"
    assert [s.headers["authorization"] for s in servers[0].requests] == [
        "GPUSCHED-KEY token-1", "GPUSCHED-KEY token-2", "GPUSCHED-KEY token-3"]
    assert servers[0].connections == 1  # and one keep-alive connection
    assert servers[0].requests[0].headers["host"] == str(servers[0].endpoint)


def test_a_refused_controller_gives_way_to_the_next_and_the_answerer_is_tried_first(
        servers: list[TcpServer]) -> None:
    servers[0].reply = unavailable
    with client(closed_port(), servers[0].endpoint, servers[1].endpoint) as c:
        assert c.request("POST", "/v1/jobs/7/signal", {"signal": 10})["path"] == \
            "/v1/jobs/7/signal"  # 503: not acted on, so even a signal may move on
        assert c.request("GET", "/v1/ping")["path"] == "/v1/ping"
    assert servers[0].paths == ["/v1/jobs/7/signal"]  # the second request began at [1]
    assert servers[1].paths == ["/v1/jobs/7/signal", "/v1/ping"]


def test_a_get_left_unanswered_is_asked_of_the_next(servers: list[TcpServer]) -> None:
    servers[0].reply = lambda seen: None
    with client(servers[0].endpoint, servers[1].endpoint) as c:
        assert c.request("GET", "/v1/jobs?all=1")["path"] == "/v1/jobs?all=1"
    assert servers[0].paths == servers[1].paths == ["/v1/jobs?all=1"]


@pytest.mark.parametrize("path, body", [("/v1/jobs/7/signal", {"signal": 10}),
                                        ("/v1/jobs/7/requeue", None),
                                        ("/v1/jobs", {"script": "x"})])
def test_a_post_that_may_have_been_applied_is_never_sent_again(
        servers: list[TcpServer], path: str, body: dict[str, object] | None) -> None:
    servers[0].reply = lambda seen: None
    with client(servers[0].endpoint, servers[1].endpoint) as c, \
            pytest.raises(Unavailable, match="closed the connection before answering"):
        c.request("POST", path, body)
    assert servers[0].paths == [path] and servers[1].paths == []


def test_a_submission_with_a_key_is_sent_again_with_the_same_key(
        servers: list[TcpServer]) -> None:
    servers[0].reply = lambda seen: None
    body = {"script": "#!/bin/sh\n", "submit_key": "abc123"}
    with client(servers[0].endpoint, servers[1].endpoint) as c:
        assert c.request("POST", "/v1/jobs", body)["body"] == body
    sent = [json.loads(s.body) for s in (*servers[0].requests, *servers[1].requests)]
    assert sent == [body, body]
    tokens = {s.headers["authorization"] for s in (*servers[0].requests, *servers[1].requests)}
    assert len(tokens) == 2  # each try with a credential of its own


def test_an_authentication_error_is_not_taken_elsewhere(servers: list[TcpServer]) -> None:
    servers[0].reply = lambda seen: json_reply(
        401, {"error": {"code": "auth", "message": "credential expired"}})
    with client(servers[0].endpoint, servers[1].endpoint) as c, \
            pytest.raises(AuthError, match="credential expired"):
        c.request("GET", "/v1/ping")
    assert servers[1].paths == []


def test_rounds_are_bounded_and_paused(servers: list[TcpServer]) -> None:
    for server in servers:
        server.reply = unavailable
    started = time.monotonic()
    with ApiClient(controllers=[s.endpoint for s in servers], credentials=credentials(),
                   rounds=3) as c, pytest.raises(Unavailable, match="no gpusched controller "
                                                                    "answered"):
        c.request("GET", "/v1/ping")
    took = time.monotonic() - started
    assert [len(s.requests) for s in servers] == [3, 3]
    assert took >= 0.2 + 0.4  # the pauses between the passes


def test_the_requests_timeout_bounds_every_round(servers: list[TcpServer]) -> None:
    for server in servers:
        server.reply = unavailable
    started = time.monotonic()
    with ApiClient(controllers=[s.endpoint for s in servers], credentials=credentials(),
                   rounds=50, timeout=1.0) as c, pytest.raises(Unavailable):
        c.request("GET", "/v1/ping")
    assert time.monotonic() - started < 3.0
    assert len(servers[0].requests) < 50


def test_every_controller_refusing_names_them(servers: list[TcpServer]) -> None:
    first, second = closed_port(), closed_port()
    with client(first, second, timeout=2.0) as c, pytest.raises(Unavailable) as caught:
        c.request("GET", "/v1/ping")
    assert str(first) in caught.value.message and str(second) in caught.value.message


def test_a_credential_that_cannot_be_made_fails_at_once(servers: list[TcpServer]) -> None:
    def broken() -> str:
        raise Unavailable("cannot reach gpusched authd at /run/x: No such file")

    with ApiClient(controllers=[servers[0].endpoint], credentials=broken) as c, \
            pytest.raises(Unavailable, match="authd"):
        c.request("GET", "/v1/ping")
    assert servers[0].paths == []


def test_the_unix_socket_carries_no_credential(tmp_path: Path) -> None:
    from tests.cli.test_client import MiniServer

    server = MiniServer(Path("/tmp") / f"gs-{tmp_path.name[-20:]}.sock")
    try:
        with ApiClient(server.path, credentials=credentials()) as c:
            c.request("GET", "/v1/ping")
        assert "authorization" not in server.requests[0].headers
    finally:
        server.close()
        server.path.unlink()


@pytest.mark.parametrize("method, path, body, safe", [
    ("GET", "/agent/v1/work?node=n1&wait=20", None, True),
    ("POST", "/v1/jobs", {"script": "x"}, False),
    ("POST", "/v1/jobs", {"script": "x", "submit_key": "k"}, True),
    ("POST", "/v1/jobs/test", {}, True),
    ("POST", "/v1/jobs/12/cancel", {}, True),
    ("POST", "/v1/jobs/12/hold", {}, True),
    ("POST", "/v1/jobs/12/update", {"time_limit": 60}, True),
    ("POST", "/v1/jobs/12/signal", {"signal": 10}, False),
    ("POST", "/v1/jobs/12/requeue", {}, False),
    ("POST", "/v1/jobs/1\u00b2/cancel", {}, False),
    ("POST", "/v1/jobs//cancel", {}, False),
    ("POST", "/v1/jobs/12/x/cancel", {}, False),
    ("POST", "/v1/jobs/12/release?x=1", {}, True),
    ("POST", "/v1/jobs/7/steps", {}, False),
    ("POST", "/agent/v1/commands/7/done", {}, True),
    ("POST", "/agent/v1/health", {}, True),
    ("POST", "/v1/gpus/resume", {}, True),
    ("POST", "/v1/nodes//drain", {}, False),
    ("POST", "v1/jobs/test", {}, False),
    ("POST", "/v1/jobs/test/", {}, False),
    ("POST", "/v1/nodes/gpu01/drain", {}, True),
    ("POST", "/v1/admin/apply", {}, True),
    ("POST", "/agent/v1/register", {}, True),
    ("POST", "/agent/v1/jobs/12/ended", {}, True),
    ("POST", "/agent/v1/samples", {}, False),
    ("POST", "/v1/something/new", {}, False),
    ("DELETE", "/v1/jobs/12", None, False),
])
def test_which_requests_may_be_sent_twice(method: str, path: str,
                                          body: dict[str, object] | None, safe: bool) -> None:
    assert retry_safe(method, path, body) is safe


def test_gpusched_controllers_in_the_environment_chooses_tcp(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, servers: list[TcpServer]) -> None:
    config = tmp_path / "client.toml"
    config.write_text('controllers = ["ctl9:6820"]\n[auth]\nmethod = "key"\n')
    monkeypatch.setenv("GPUSCHED_CONFIG", str(config))
    assert [str(e) for e in client_settings().controllers] == ["ctl9:6820"]
    monkeypatch.setenv("GPUSCHED_CONTROLLERS", f"{servers[1].endpoint}, {servers[0].endpoint}")
    c = ApiClient(credentials=credentials())
    assert c.controllers == [str(servers[1].endpoint), str(servers[0].endpoint)]
    assert c.socket_path is None
    with c:
        c.request("GET", "/v1/ping")
    assert servers[1].paths == ["/v1/ping"]


@pytest.mark.parametrize("env, toml, message", [
    ("ctl1:99999", '[auth]\nmethod = "key"\n', "GPUSCHED_CONTROLLERS: expected 'host:port'"),
    ("ctl1:6820", "", "controllers over TCP need credentials: set [auth] method"),
    ("", 'controllers = ["ctl1:6820"]\n', "controllers over TCP need credentials"),
    ("", 'controllers = "ctl1"\n[auth]\nmethod = "key"\n', "controllers: expected a list"),
])
def test_bad_client_settings_are_one_clear_error(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: str, toml: str,
        message: str) -> None:
    config = tmp_path / "client.toml"
    config.write_text(toml)
    monkeypatch.setenv("GPUSCHED_CONFIG", str(config))
    monkeypatch.setenv("GPUSCHED_CONTROLLERS", env)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        ApiClient()


def test_without_controllers_the_unix_socket_as_before(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "client.toml"
    config.write_text('[auth]\nmethod = "munge"\n')
    monkeypatch.setenv("GPUSCHED_CONFIG", str(config))
    monkeypatch.delenv("GPUSCHED_CONTROLLERS", raising=False)
    monkeypatch.setenv("GPUSCHED_SOCKET", str(tmp_path / "c.sock"))
    assert ApiClient().socket_path == tmp_path / "c.sock"
