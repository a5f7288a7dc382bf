"""``POST /agent/v1/nodes/{node}/health`` through the controller's real API, served in
this process on a real Unix socket and on TCP (key credentials), against a real
database: a failing check drains the node, a passing one lifts only its own drain, an
administrator's drain stays and their resume clears it; no one but the node's own agent
may report, and a bad report is one 400 that changes nothing."""

from __future__ import annotations

import http.client
import json
import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpusched.auth.backends import Authenticator
from gpusched.auth.keys import derive_host_key, new_master_key
from gpusched.auth.keytoken import (
    SCHEME_KEY,
    KeySigner,
    KeyVerifier,
    authorization_value,
)
from gpusched.client.endpoints import Endpoint
from gpusched.controller.api import Api
from gpusched.controller.events import Events
from gpusched.controller.http import (
    HttpService,
    ServerLimits,
    TcpHttpServer,
    UnixHttpServer,
)
from gpusched.db.models import Node
from tests.db.node import node_sessions

MASTER = new_master_key()
N1 = KeySigner(derive_host_key(MASTER, "n1"))
N2 = KeySigner(derive_host_key(MASTER, "n2"))
LOGIN = KeySigner(derive_host_key(MASTER, "login1"))
NOBODY = 65534
WITHIN = 10.0


@dataclass
class Served:
    """The API on a Unix socket (anyone may connect) and on a TCP port."""

    sessions: sessionmaker[Session]
    socket_path: Path
    port: int

    def local(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        """A request on the Unix socket, as this process (root)."""
        return _exchange(self.socket_path, method, path, body)

    def tcp(self, method: str, path: str, body: Any, header: str) -> tuple[int, dict[str, Any]]:
        """A request over TCP with this Authorization header."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WITHIN)
        try:
            conn.request(method, path, json.dumps(body), {
                "Content-Type": "application/json", "Authorization": header})
            answer = conn.getresponse()
            return answer.status, json.loads(answer.read() or b"{}")
        finally:
            conn.close()

    def node(self, name: str = "n1") -> tuple[str, str | None, str | None]:
        """The node's (state, reason, drained_by) as stored."""
        with self.sessions() as s:
            node = s.scalars(select(Node).where(Node.name == name)).one()
            return node.state, node.reason, node.drained_by


def _request_bytes(method: str, path: str, body: Any) -> bytes:
    payload = b"" if body is None else json.dumps(body).encode()
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode() + payload


def _parse_answer(data: bytes) -> tuple[int, dict[str, Any]]:
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(rest or b"{}")


def _exchange(path: Path, method: str, target: str, body: Any) -> tuple[int, dict[str, Any]]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(WITHIN)
        sock.connect(str(path))
        sock.sendall(_request_bytes(method, target, body))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return _parse_answer(data)


def _exchange_as(uid: int, path: Path, method: str, target: str, body: Any
                 ) -> tuple[int, dict[str, Any]]:
    """The same request on the Unix socket from a child process running as ``uid``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to uid, send, hand the raw answer back, exit
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(WITHIN)
                sock.connect(str(path))
                sock.sendall(_request_bytes(method, target, body))
                while chunk := sock.recv(65536):
                    os.write(write_end, chunk)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 65536):
        data += chunk
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, data
    return _parse_answer(data)


@pytest.fixture
def served(db_url: str) -> Iterator[Served]:
    with node_sessions(db_url, [{"index": 0, "uuid": "GPU-0"}]) as sessions:
        from gpusched.db import agents

        with sessions() as s, s.begin():
            agents.register_node(s, {"node": "n2", "uid": 0, "gpus": []})
        router = Api(sessions, Events(), lambda: True).router()
        service = HttpService(router, ServerLimits(), Authenticator(KeyVerifier(MASTER)),
                              SCHEME_KEY)
        folder = Path(tempfile.mkdtemp(prefix="gpusched-health-"))
        folder.chmod(0o755)  # an unprivileged caller reaches the socket
        unix = UnixHttpServer(folder / "api.sock", router, 0o666, service=service)
        tcp = TcpHttpServer(Endpoint("127.0.0.1", 0), service)
        threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05},
                                    daemon=True) for s in (unix, tcp)]
        for thread in threads:
            thread.start()
        try:
            yield Served(sessions, folder / "api.sock", tcp.port)
        finally:
            for server in (unix, tcp):
                server.shutdown()
                server.server_close()
            for thread in threads:
                thread.join(WITHIN)
            folder.rmdir()


def _report(ok: bool, reason: str | None = None, node: str = "n1") -> dict[str, Any]:
    return {"node": node, "ok": ok, "reason": reason}


HEALTH = "/agent/v1/nodes/n1/health"


def test_a_failing_check_drains_and_a_passing_one_returns_the_node(served: Served) -> None:
    status, answer = served.local("POST", HEALTH, _report(False, "disk /scratch full"))
    assert status == 200, answer
    assert (answer["state"], answer["reason"], answer["drained_by"]) == (
        "DRAIN", "health check: disk /scratch full", "health")
    assert served.node() == ("DRAIN", "health check: disk /scratch full", "health")
    _, listed = served.local("GET", "/v1/nodes")
    mine = next(n for n in listed["nodes"] if n["name"] == "n1")
    assert (mine["state"], mine["reason"], mine["drained_by"]) == (
        "DRAIN", "health check: disk /scratch full", "health")
    status, answer = served.local("POST", HEALTH, _report(False, "fan 3 stopped"))
    assert served.node() == ("DRAIN", "health check: fan 3 stopped", "health")
    status, answer = served.local("POST", HEALTH, _report(True))
    assert status == 200 and answer["state"] == "UP" and answer["changed"] is True
    assert served.node() == ("UP", None, None)
    status, answer = served.local("POST", HEALTH, _report(True))  # again: nothing to do
    assert status == 200 and answer["changed"] is False
    assert served.node("n2") == ("UP", None, None)  # the other node was never touched


def test_an_administrators_drain_outlasts_the_health_check(served: Served) -> None:
    assert served.local("POST", "/v1/nodes/n1/drain", {"reason": "bad fan"})[0] == 200
    served.local("POST", HEALTH, _report(False, "hot"))
    assert served.node() == ("DRAIN", "bad fan", None)  # kept, reason and all
    served.local("POST", HEALTH, _report(True))
    assert served.node() == ("DRAIN", "bad fan", None)  # a pass does not lift it
    # An administrator draining a node the check drained takes the drain over...
    served.local("POST", "/v1/nodes/n1/resume")
    served.local("POST", HEALTH, _report(False, "hot"))
    assert served.node() == ("DRAIN", "health check: hot", "health")
    served.local("POST", "/v1/nodes/n1/drain", {"reason": "replacing the PSU"})
    assert served.node() == ("DRAIN", "replacing the PSU", None)
    served.local("POST", HEALTH, _report(True))
    assert served.node() == ("DRAIN", "replacing the PSU", None)
    # ...and their resume clears any drain.
    served.local("POST", HEALTH, _report(False, "x"))
    assert served.local("POST", "/v1/nodes/n1/resume")[1]["state"] == "UP"
    assert served.node() == ("UP", None, None)


def test_a_health_drain_survives_the_agent_registering_again(served: Served) -> None:
    served.local("POST", HEALTH, _report(False, "no nvidia-smi"))
    status, _ = served.local("POST", "/agent/v1/register",
                             {"node": "n1", "uid": 0, "gpus": [{"index": 0, "uuid": "GPU-0"}]})
    assert status == 200
    assert served.node() == ("DRAIN", "health check: no nvidia-smi", "health")
    served.local("POST", HEALTH, _report(True))
    assert served.node() == ("UP", None, None)


def test_a_registration_carries_the_checks_result_in_one_step(served: Served) -> None:
    body = {"node": "n1", "uid": 0, "gpus": [{"index": 0, "uuid": "GPU-0"}]}
    status, _ = served.local("POST", "/agent/v1/register",
                             {**body, "health": _report(False, "ib0 down")})
    assert status == 200
    assert served.node() == ("DRAIN", "health check: ib0 down", "health")
    status, _ = served.local("POST", "/agent/v1/register", {**body, "health": _report(True)})
    assert status == 200 and served.node() == ("UP", None, None)
    # A result that is malformed or names another node registers nothing.
    served.local("POST", "/v1/nodes/n1/drain", {"reason": "by hand"})
    for health, message in ((_report(False, node="n2"), "the report is for node n2"),
                            ({"node": "n1", "ok": "no"}, "ok: expected true or false")):
        status, answer = served.local("POST", "/agent/v1/register", {**body, "health": health})
        assert status == 400 and message in answer["error"]["message"], answer
        assert served.node() == ("DRAIN", "by hand", None)


@pytest.mark.parametrize(("body", "message"), [
    ({"node": "n1"}, "ok: expected true or false, got nothing"),
    ({"node": "n1", "ok": "false"}, "ok: expected true or false, got 'false'"),
    ({"node": "n1", "ok": False, "reason": "x" * 257}, "reason: expected at most 256"),
    ({"node": "n1", "ok": False, "reason": "a\x1b[2Jb"}, "U+001B is not allowed"),
    ({"node": "n1", "ok": False, "why": "x"}, "unknown field 'why' in the health report"),
    ({"node": "n2", "ok": False}, "node: the report is for n2, the path names n1"),
    ([1, 2], "request body must be a JSON object"),
])
def test_a_bad_report_is_refused_and_changes_nothing(served: Served, body: Any,
                                                     message: str) -> None:
    status, answer = served.local("POST", HEALTH, body)
    assert status == 400, answer
    assert message in answer["error"]["message"] and "\n" not in answer["error"]["message"]
    assert served.node() == ("UP", None, None) and served.node("n2") == ("UP", None, None)


def test_an_unknown_node_is_not_found(served: Served) -> None:
    status, answer = served.local("POST", "/agent/v1/nodes/n9/health", _report(False, node="n9"))
    assert status == 404 and "unknown node 'n9'" in answer["error"]["message"]


def test_only_the_nodes_own_agent_may_report(served: Served) -> None:
    failing = _report(False, "forged")
    refusals = {
        "another node's credential": (N2.authorization(node="n2"),
                                      "credential is for node n2, not n1"),
        "a user's credential": (authorization_value(SCHEME_KEY, LOGIN.sign(1000, 1000)),
                                "the credential is a user's (uid 1000)"),
        "root's user credential": (authorization_value(SCHEME_KEY, LOGIN.sign(0, 0)),
                                   "the credential is a user's (uid 0)"),
        "a node credential not root's": (
            authorization_value(SCHEME_KEY, N1.sign(1000, 1000, node="n1")),
            "a node credential must be root's, not uid 1000's"),
    }
    for what, (header, message) in refusals.items():
        status, answer = served.tcp("POST", HEALTH, failing, header)
        assert status == 403, (what, status, answer)
        assert message in answer["error"]["message"], (what, answer)
    status, answer = _exchange_as(NOBODY, served.socket_path, "POST", HEALTH, failing)
    assert status == 403 and "only an agent" in answer["error"]["message"], answer
    assert served.node() == ("UP", None, None)
    status, answer = served.tcp("POST", HEALTH, failing, N1.authorization(node="n1"))
    assert status == 200 and served.node() == ("DRAIN", "health check: forged", "health")
