"""The API over TCP, end to end, with each authentication method: a real controller
listening on 127.0.0.1 with a real munged (its own key) or with key files and a real
``gpusched authd``; a real agent that reaches it over TCP with its node's credentials
(its Unix socket path points nowhere); real unprivileged users whose CLIs know only the
``controllers`` list of their configuration (GPUSCHED_SOCKET points nowhere).

Users submit, see and cancel; no forged, replayed, expired, garbage or missing
credential gets anything stored; a user's credential cannot act as an agent, nor one
node's as another's; members of admin_group administer.
"""

from __future__ import annotations

import grp
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpusched.auth.keys import (
    derive_host_key,
    new_master_key,
    read_host_key,
    render_host_key,
    render_master_key,
    write_key_file,
)
from gpusched.auth.keytoken import KeySigner
from gpusched.auth.munge import MungeSigner
from gpusched.auth.mungeclient import munge_client
from gpusched.client import ApiClient
from gpusched.client.endpoints import Endpoint
from tests.auth.munged import Munged
from tests.e2e.cluster import BIN, Cluster, wait_for
from tests.security.conftest import LocalUser, run_as

ADMIN_GROUP = "gpusched-test-admins"


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Net:
    """A cluster in cluster mode and the files of a "login host" its users work on."""

    method: str
    cluster: Cluster
    ports: tuple[int, int]  # the controller's, and a standby's (started by some tests)
    user_env: dict[str, str]
    munged: Munged | None = None
    master: Any = None  # the key method's master key
    login_key: Path | None = None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.ports[0])

    def as_user(self, user: LocalUser, *argv: str) -> subprocess.CompletedProcess[str]:
        """A CLI run by ``user`` on the login host."""
        return run_as(user, [str(BIN / argv[0]), *argv[1:]], env=self.user_env,
                      cwd=self.cluster.work)

    def user_header(self, user: LocalUser) -> str:
        """A fresh user credential, made by ``user``'s own process."""
        done = self.as_user(user, "gpusched", "auth", "token")
        assert done.returncode == 0, done
        return done.stdout.strip()

    def root_header(self, node: str | None = None, **signing: Any) -> str:
        """A credential of root (the test process), for ``node`` if given."""
        if self.method == "key":
            host = node or "login1"
            signer = KeySigner(derive_host_key(self.master, host))
            return f"GPUSCHED-KEY {signer.sign(0, 0, node=node, **signing)}"
        assert self.munged is not None
        return MungeSigner(munge_client(self.munged.socket), **signing).authorization(node=node)

    def jobs(self) -> list[dict[str, Any]]:
        return self.cluster.jobs()


def raw(port: int, method: str, path: str, body: dict[str, Any] | None = None,
         header: str | None = None) -> tuple[int, dict[str, Any]]:
    """One request over TCP with exactly this Authorization header (or none)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Content-Type": "application/json"}
        if header is not None:
            headers["Authorization"] = header
        conn.request(method, path, json.dumps(body) if body is not None else None, headers)
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read() or b"{}")
    finally:
        conn.close()


def _auth_files(root: Path, method: str, munged: Munged | None) -> tuple[str, str, Any, Path]:
    """The cluster's [auth] table, the login host's, the master key and the login key."""
    if method == "munge":
        assert munged is not None
        table = f'[auth]\nmethod = "munge"\nmunge_socket = "{munged.socket}"\n'
        return table, table, None, Path("/nonexistent")
    master = new_master_key()
    write_key_file(root / "master.key", render_master_key(master))
    write_key_file(root / "node01.key", render_host_key(derive_host_key(master, "node01")))
    write_key_file(root / "login1.key", render_host_key(derive_host_key(master, "login1")))
    common = f'method = "key"\nkey_file = "{root / "master.key"}"\n'
    cluster = f'[auth]\n{common}host_key_file = "{root / "node01.key"}"\n'
    login = (f'[auth]\n{common}host_key_file = "{root / "login1.key"}"\n'
             f'authd_socket = "{root / "authd" / "authd.sock"}"\n')
    return cluster, login, master, root / "login1.key"


def _ensure_admin_group(member: LocalUser) -> None:
    try:
        grp.getgrnam(ADMIN_GROUP)
    except KeyError:
        subprocess.run(["groupadd", "--system", ADMIN_GROUP], check=True, capture_output=True)
    subprocess.run(["gpasswd", "-a", member.name, ADMIN_GROUP], check=True, capture_output=True)


@pytest.fixture(params=["munge", "key"])
def net(request: pytest.FixtureRequest, db_url: str,
        attackers: tuple[LocalUser, LocalUser]) -> Iterator[Net]:
    """A controller on TCP, its agent over TCP, users on a login host; alice is an
    administrator (admin_group)."""
    method = request.param
    _ensure_admin_group(attackers[1])
    munged = Munged(origin="127.0.0.1") if method == "munge" else None
    ports = (free_port(), free_port())
    scratch = Path(tempfile.mkdtemp(prefix="gpusched-net-", dir="/tmp"))
    os.chmod(scratch, 0o755)
    cluster_auth, login_auth, master, login_key = _auth_files(scratch, method, munged)
    controllers = [f"127.0.0.1:{p}" for p in ports]
    cluster = Cluster(
        db_url, listen=[controllers[0]], controllers=controllers, auth_toml=cluster_auth,
        controller_toml=(f'admin_group = "{ADMIN_GROUP}"\n'
                         'node_addresses = { node01 = ["127.0.0.1"], node02 = ["127.0.0.1"] }'))
    login = cluster.root / "login.toml"
    login.write_text(f"controllers = {json.dumps(controllers)}\n{login_auth}")
    os.chmod(login, 0o644)
    user_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCHED_")}
    user_env.update(GPUSCHED_CONFIG=str(login), GPUSCHED_SOCKET="/nonexistent/gpusched.sock")
    made = Net(method, cluster, ports, user_env, munged, master, login_key)
    try:
        if method == "key":
            authd = subprocess.Popen([str(BIN / "gpusched"), "authd", "-c", str(login)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            made.procs.append(authd)
            wait_for(lambda: (scratch / "authd" / "authd.sock").exists() or authd.poll(),
                     what="authd's socket")
        cluster.start("controller")
        cluster.wait_controller()
        agent_config = cluster.root / "agent.toml"  # no way to the Unix socket: TCP only
        agent_config.write_text(cluster.config.read_text().replace(
            f'"{cluster.socket}"', f'"{cluster.root / "no-socket-here.sock"}"'))
        cluster.start("agent", agent_config)
        cluster.wait_node_up()
        yield made
    finally:
        cluster.close()
        for proc in made.procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
        if munged is not None:
            munged.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def submitted(result: subprocess.CompletedProcess[str]) -> int:
    assert result.returncode == 0, result
    return int(result.stdout.strip())


def test_a_user_on_another_host_submits_sees_and_cancels_over_tcp(
        net: Net, attackers: tuple[LocalUser, LocalUser]) -> None:
    mallory = attackers[0]
    done = submitted(net.as_user(mallory, "gsubmit", "--parsable", "-o", "out-%j.txt",
                                 "--wrap", "id -u; hostname"))
    job = net.cluster.wait_state(done, "COMPLETED", timeout=30)
    assert job["user"] == mallory.name and job["node"] == "node01"
    assert (net.cluster.work / f"out-{done}.txt").read_text().split()[0] == str(mallory.uid)
    long = submitted(net.as_user(mallory, "gsubmit", "--parsable", "--wrap", "sleep 300"))
    net.cluster.wait_state(long, "RUNNING", timeout=30)
    shown = net.as_user(mallory, "gqueue", "--me", "--json")
    assert shown.returncode == 0, shown
    assert [j["job_id"] for j in json.loads(shown.stdout)["jobs"]] == [long]
    cancelled = net.as_user(mallory, "gcancel", str(long))
    assert cancelled.returncode == 0, cancelled
    net.cluster.wait_state(long, "CANCELLED", timeout=30)
    assert "no-socket-here.sock" not in (net.cluster.root / "agent.log").read_text()


def test_no_bad_credential_gets_anything_stored(
        net: Net, attackers: tuple[LocalUser, LocalUser]) -> None:
    mallory = attackers[0]
    port, before = net.ports[0], len(net.jobs())
    job = {"script": "#!/bin/sh\ntrue\n", "work_dir": str(net.cluster.work)}
    good = net.user_header(mallory)
    scheme, token = good.split(" ", 1)
    if net.method == "key":
        parts = token.split(":")
        parts[4] = parts[5] = "0"  # claim to be root, keeping the user's signature
        forged = f"{scheme} {':'.join(parts)}"
        expired = net.root_header(now=time.time() - 600)
    else:
        other = Munged()  # a munged with another key: its credentials are forgeries here
        try:
            forged = MungeSigner(munge_client(other.socket)).authorization()
        finally:
            other.stop()
        expired = net.root_header(ttl=1)
        time.sleep(2.5)
    refusals = {"missing": None, "garbage": f"{scheme} garbage!", "other scheme": "Basic eA==",
                "forged": forged, "expired": expired}
    for what, header in refusals.items():
        status, body = raw(port, "POST", "/v1/jobs", job, header)
        assert status == 401 and body["error"]["code"] == "auth", (what, status, body)
    assert raw(port, "POST", "/v1/jobs", job, good)[0] == 201
    status, body = raw(port, "POST", "/v1/jobs", {**job, "name": "replayed"}, good)
    assert status == 401 and "replayed" in body["error"]["message"], body
    assert len(net.jobs()) == before + 1


def test_an_agent_speaks_only_for_its_own_node(
        net: Net, attackers: tuple[LocalUser, LocalUser]) -> None:
    port = net.ports[0]
    register = {"node": "node01", "gpus": [], "uid": 0, "source": "static", "links": []}
    user = net.user_header(attackers[0])
    status, body = raw(port, "POST", "/agent/v1/register", register, user)
    assert status == 403 and "credential is a user's" in body["error"]["message"], body
    root_user = net.root_header()  # root, but a user credential: no node's agent
    assert raw(port, "POST", "/agent/v1/register", register, root_user)[0] == 403
    checks = [("POST", "/agent/v1/register", register),
              ("GET", "/agent/v1/work?node=node01&wait=0", None),
              ("POST", "/agent/v1/jobs/1/ended", {"node": "node01", "outcome": "completed"})]
    for method, path, body in checks:
        status, answer = raw(port, method, path, body, net.root_header(node="node02"))
        assert status == 403, (path, status, answer)
        assert answer["error"]["message"] == "credential is for node node02, not node01"
    status, answer = raw(port, "POST", "/agent/v1/register", register)
    assert status == 401
    nodes = net.cluster.api("GET", "/v1/nodes")["nodes"]
    assert [(n["name"], n["state"], len(n["gpus"])) for n in nodes] == [("node01", "UP", 4)]


def test_admin_group_members_administer_over_tcp(
        net: Net, attackers: tuple[LocalUser, LocalUser]) -> None:
    mallory, alice = attackers
    theirs = submitted(net.as_user(mallory, "gsubmit", "--parsable", "--hold",
                                   "--wrap", "true"))
    hers = submitted(net.as_user(alice, "gsubmit", "--parsable", "--hold", "--wrap", "true"))
    refused = net.as_user(mallory, "gcancel", str(hers))
    assert refused.returncode == 1 and "you may cancel only your own jobs" in refused.stderr
    assert net.as_user(mallory, "gcontrol", "drain", "node", "node01", "--reason",
                       "x").returncode == 1
    assert net.as_user(alice, "gcancel", str(theirs)).returncode == 0
    net.cluster.wait_state(theirs, "CANCELLED")
    drained = net.as_user(alice, "gcontrol", "drain", "node", "node01", "--reason", "fan")
    assert drained.returncode == 0, drained
    assert net.cluster.api("GET", "/v1/nodes")["nodes"][0]["state"] == "DRAIN"
    assert net.cluster.job(hers)["state"] == "PENDING"


def test_cli_and_agent_carry_on_when_a_controller_dies(
        net: Net, attackers: tuple[LocalUser, LocalUser]) -> None:
    mallory = attackers[0]
    cluster = net.cluster
    standby_socket = cluster.start_standby(listen=[f"127.0.0.1:{net.ports[1]}"])
    wait_for(lambda: cluster.try_api("GET", "/v1/ping", socket=standby_socket),
             what="the standby", seen=cluster.logs)
    # The same submission sent to both controllers (a lost answer, a failover): one job.
    body = {"script": "#!/bin/sh\ntrue\n", "work_dir": str(cluster.work), "hold": True,
            "submit_key": os.urandom(8).hex()}
    answers = []
    for port in net.ports:
        with ApiClient(controllers=[Endpoint("127.0.0.1", port)],
                       credentials=net.root_header) as client:
            answers.append(client.request("POST", "/v1/jobs", body))
    assert answers[0]["job_id"] == answers[1]["job_id"] and answers[1]["existing"] is True
    assert [j["job_id"] for j in cluster.jobs()] == [answers[0]["job_id"]]
    first = submitted(net.as_user(mallory, "gsubmit", "--parsable", "--wrap", "true"))
    cluster.wait_state(first, "COMPLETED", timeout=30)

    cluster.kill("controller")  # the first of everyone's list (and the leader, likely)
    survivor = standby_socket

    def state(job_id: int) -> str:
        return str(cluster.api("GET", f"/v1/jobs/{job_id}", socket=survivor)["state"])

    after = submitted(net.as_user(mallory, "gsubmit", "--parsable", "--wrap", "true"))
    wait_for(lambda: state(after) == "COMPLETED", 40, f"job {after} run after the failover",
             seen=lambda: (state(after), cluster.logs()))
    shown = net.as_user(mallory, "gqueue", "--me", "--json", "--states", "all")
    assert shown.returncode == 0, shown
    assert {first, after} <= {j["job_id"] for j in json.loads(shown.stdout)["jobs"]}
    held = submitted(net.as_user(mallory, "gsubmit", "--parsable", "--hold", "--wrap", "true"))
    assert net.as_user(mallory, "gcancel", str(held)).returncode == 0
    assert state(held) == "CANCELLED"


def test_the_login_host_key_stays_unreadable(net: Net,
                                            attackers: tuple[LocalUser, LocalUser]) -> None:
    """The users' credentials come from authd (key) or munged, never from a key file
    they could read: the CLI works although the files it would need are root's."""
    if net.method == "key":
        assert net.login_key is not None
        read = net.as_user(attackers[0], "gpusched", "auth", "token")
        assert read.returncode == 0 and read.stdout.startswith("GPUSCHED-KEY 1:")
        assert run_as(attackers[0], ["cat", str(net.login_key)]).returncode != 0
        assert read_host_key(net.login_key).host == "login1"
    else:
        assert net.munged is not None
        assert run_as(attackers[0], ["cat", str(net.munged.key_file)]).returncode != 0
