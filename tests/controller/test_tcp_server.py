"""The controller's HTTP server on TCP, run in this process with the key back-end's real
verifier: every request must prove its caller, a bad or missing credential is a 401 and
the connection is closed before any handler runs, and connections are capped per
address at accept and per uid once proved. The Unix socket of the same service keeps
the kernel's word and ignores credentials."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpusched.auth.backends import Authenticator
from gpusched.auth.keys import derive_host_key, new_master_key
from gpusched.auth.keytoken import KeySigner, KeyVerifier
from gpusched.client import ApiClient
from gpusched.client.endpoints import Endpoint
from gpusched.controller.http import (
    HttpService,
    Request,
    Router,
    ServerLimits,
    TcpHttpServer,
    UnixHttpServer,
)
from gpusched.errors import AuthError, ConfigError, Unavailable
from tests.e2e.cluster import wait_for

MASTER = new_master_key()
LOGIN = KeySigner(derive_host_key(MASTER, "login1"))
NODE = KeySigner(derive_host_key(MASTER, "gpu01"))
OTHER_MASTER = new_master_key()
WITHIN = 5.0


class Seen:
    """Handlers that record the callers reaching them."""

    def __init__(self) -> None:
        self.callers: list[dict[str, Any]] = []

    def router(self) -> Router:
        r = Router()
        r.add("GET", "/v1/ping", self.whoami)
        r.add("POST", "/v1/jobs", self.whoami)
        return r

    def whoami(self, request: Request) -> tuple[int, dict[str, Any]]:
        c = request.caller
        self.callers.append({"pid": c.pid, "uid": c.uid, "gid": c.gid, "host": c.host,
                             "node": c.node, "remote": c.remote})
        return 200, self.callers[-1]


@contextmanager
def serving(tmp_path: Path, seen: Seen, **limits: Any) -> Iterator[tuple[TcpHttpServer,
                                                                       UnixHttpServer]]:
    """One service on TCP (127.0.0.1, a free port) and on a Unix socket."""
    service = HttpService(seen.router(), ServerLimits(**limits),
                          Authenticator(KeyVerifier(MASTER)), "GPUSCHED-KEY")
    tcp = TcpHttpServer(Endpoint("127.0.0.1", 0), service)
    unix = UnixHttpServer(tmp_path / "api.sock", seen.router(), service=service)
    threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05},
                                daemon=True) for s in (tcp, unix)]
    for thread in threads:
        thread.start()
    try:
        yield tcp, unix
    finally:
        for server in (tcp, unix):
            server.shutdown()
            server.server_close()
        for thread in threads:
            thread.join(WITHIN)


@pytest.fixture
def seen() -> Seen:
    return Seen()


@pytest.fixture
def servers(tmp_path: Path, seen: Seen) -> Iterator[tuple[TcpHttpServer, UnixHttpServer]]:
    with serving(tmp_path, seen) as pair:
        yield pair


def raw_exchange(port: int, request: bytes, source: str = "127.0.0.1"
                 ) -> tuple[int, dict[str, str], dict[str, Any], bool]:
    """Send raw bytes; the status, headers, JSON body, and whether the server then
    closed the connection."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=WITHIN,
                                    source_address=(source, 0))
    with sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"closed without an answer: {data!r}"
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in
                   (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        while len(rest) < length:
            rest += sock.recv(65536)
        sock.settimeout(0.5)  # a connection kept alive stays open; a refused one closes
        try:
            closed = sock.recv(1) == b""
        except TimeoutError:
            closed = False
    return int(lines[0].split()[1]), headers, json.loads(rest[:length]), closed


def ping(header: str | None) -> bytes:
    auth = f"Authorization: {header}\r\n" if header is not None else ""
    return f"GET /v1/ping HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode()


def test_a_request_with_a_good_credential_is_served_as_its_caller(
        servers: tuple[TcpHttpServer, UnixHttpServer], seen: Seen) -> None:
    tcp, _ = servers
    with ApiClient(controllers=[Endpoint("127.0.0.1", tcp.port)],
                   credentials=LOGIN.authorization) as client:
        for _ in range(3):  # keep-alive, a fresh credential each time
            answer = client.request("GET", "/v1/ping")
    assert answer == {"pid": 0, "uid": 0, "gid": 0, "host": "login1", "node": None,
                      "remote": True}
    node = raw_exchange(tcp.port, ping(NODE.authorization(node="gpu01")))
    assert node[0] == 200 and (node[2]["node"], node[2]["host"]) == ("gpu01", "gpu01")


def test_another_users_credential_is_that_users(
        servers: tuple[TcpHttpServer, UnixHttpServer]) -> None:
    tcp, _ = servers
    header = f"GPUSCHED-KEY {LOGIN.sign(1234, 5678)}"
    status, _, body, _ = raw_exchange(tcp.port, ping(header))
    assert status == 200 and (body["uid"], body["gid"]) == (1234, 5678)


def forged() -> str:
    return f"GPUSCHED-KEY {KeySigner(derive_host_key(OTHER_MASTER, 'login1')).sign(0, 0)}"


def expired() -> str:
    return f"GPUSCHED-KEY {LOGIN.sign(0, 0, now=time.time() - 600)}"


@pytest.mark.parametrize("make, message", [
    (lambda: None, "no credential"),
    (lambda: "Bearer abc", "malformed Authorization header"),
    (lambda: "GPUSCHED-KEY not-a-token", "not a gpusched key token"),
    (lambda: "GPUSCHED-MUNGE MUNGE:AAAA:", "takes GPUSCHED-KEY credentials"),
    (forged, "unknown key"),
    (expired, "expired"),
])
def test_a_missing_or_bad_credential_is_a_401_and_the_connection_closes(
        servers: tuple[TcpHttpServer, UnixHttpServer], seen: Seen, make: Any,
        message: str) -> None:
    tcp, _ = servers
    status, headers, body, closed = raw_exchange(tcp.port, ping(make()))
    assert status == 401 and body["error"]["code"] == "auth"
    assert message in body["error"]["message"]
    assert headers["www-authenticate"] == "GPUSCHED-KEY"
    assert closed and seen.callers == []


def test_a_replayed_credential_is_refused(servers: tuple[TcpHttpServer, UnixHttpServer],
                                          seen: Seen) -> None:
    tcp, _ = servers
    header = LOGIN.authorization()
    assert raw_exchange(tcp.port, ping(header))[0] == 200
    status, _, body, closed = raw_exchange(tcp.port, ping(header))
    assert (status, closed) == (401, True) and "replayed" in body["error"]["message"]
    assert len(seen.callers) == 1


def test_the_client_reports_a_refused_credential(
        servers: tuple[TcpHttpServer, UnixHttpServer]) -> None:
    tcp, _ = servers
    with ApiClient(controllers=[Endpoint("127.0.0.1", tcp.port)],
                   credentials=forged) as client, pytest.raises(AuthError, match="unknown key"):
        client.request("GET", "/v1/ping")


def test_the_unix_socket_ignores_credentials(servers: tuple[TcpHttpServer, UnixHttpServer],
                                             seen: Seen) -> None:
    _, unix = servers
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(unix.path))
    with sock:
        sock.sendall(ping(f"GPUSCHED-KEY {LOGIN.sign(1234, 1234)}"))
        data = sock.recv(65536)
    assert data.startswith(b"HTTP/1.1 200")
    assert seen.callers[-1]["uid"] == 0 and seen.callers[-1]["host"] is None
    assert seen.callers[-1]["pid"] > 0 and seen.callers[-1]["remote"] is False


def test_connections_are_capped_per_address_at_accept(tmp_path: Path, seen: Seen) -> None:
    with serving(tmp_path, seen, max_connections_per_user=2) as (tcp, _):
        held = [socket.create_connection(("127.0.0.1", tcp.port)) for _ in range(2)]
        try:
            wait_for(lambda: tcp.connections.count_address("127.0.0.1") == 2, WITHIN,
                     "two admitted")
            status, _, body, closed = raw_exchange(tcp.port, ping(LOGIN.authorization()))
            assert status == 503 and closed
            assert "127.0.0.1 already has 2 connections" in body["error"]["message"]
            # Another address is not held to 127.0.0.1's share.
            other = raw_exchange(tcp.port, ping(LOGIN.authorization()), source="127.0.0.2")
            assert other[0] == 200
        finally:
            for sock in held:
                sock.close()


def test_connections_are_capped_per_uid_once_a_request_proves_it(
        tmp_path: Path, seen: Seen) -> None:
    with serving(tmp_path, seen, max_connections_per_user=2,
                 privileged_uids=frozenset()) as (tcp, _):
        clients = [ApiClient(controllers=[Endpoint("127.0.0.1", tcp.port)],
                             credentials=lambda: f"GPUSCHED-KEY {LOGIN.sign(1000, 1000)}")
                   for _ in range(2)]
        try:
            for client in clients:  # two of uid 1000's, both from 127.0.0.1
                client.request("GET", "/v1/ping")
            assert tcp.connections.count(1000) == 2
            status, _, body, closed = raw_exchange(
                tcp.port, ping(f"GPUSCHED-KEY {LOGIN.sign(1000, 1000)}"), source="127.0.0.3")
            assert status == 503 and closed
            assert "uid 1000 already has 2 connections" in body["error"]["message"]
            assert raw_exchange(tcp.port, ping(f"GPUSCHED-KEY {LOGIN.sign(1001, 1001)}"),
                                source="127.0.0.3")[0] == 200
        finally:
            for client in clients:
                client.close()
        wait_for(lambda: tcp.connections.count() == 0, WITHIN, "all released")


def test_no_tcp_listener_without_an_authenticator(seen: Seen) -> None:
    with pytest.raises(ConfigError, match="the API over TCP needs credentials"):
        TcpHttpServer(Endpoint("127.0.0.1", 0), HttpService(seen.router()))


def test_ipv4_and_ipv6_listen_on_the_same_port(tmp_path: Path, seen: Seen) -> None:
    service = HttpService(seen.router(), None, Authenticator(KeyVerifier(MASTER)))
    v4 = TcpHttpServer(Endpoint("0.0.0.0", 0), service)
    try:
        v6 = TcpHttpServer(Endpoint("::", v4.port), service)
        try:
            threads = [threading.Thread(target=s.serve_forever, daemon=True,
                                        kwargs={"poll_interval": 0.05}) for s in (v4, v6)]
            for thread in threads:
                thread.start()
            for host in ("127.0.0.1", "::1"):
                with ApiClient(controllers=[Endpoint(host, v4.port)],
                               credentials=LOGIN.authorization) as client:
                    assert client.request("GET", "/v1/ping")["uid"] == 0
            with pytest.raises(Unavailable, match="cannot listen on"):
                TcpHttpServer(Endpoint("::", v4.port), service)
        finally:
            v6.shutdown()
            v6.server_close()
    finally:
        v4.shutdown()
        v4.server_close()
