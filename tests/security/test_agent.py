"""The node's root agent against hostile jobs: whatever a job (or a tampered database
row) holds fails that job alone, with the reason; no job runs as root unless the
agent's configuration allows it; the agent obeys no socket a user bound."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gpusched.client import ApiClient
from gpusched.errors import Unavailable
from tests.e2e.cluster import BIN, Cluster, wait_for
from tests.security.conftest import LocalUser, run_as


@pytest.fixture
def strict_cluster(db_url: str) -> Iterator[Cluster]:
    """A cluster whose agent keeps the default min_job_uid (no job as root)."""
    c = Cluster(db_url, min_job_uid=1)
    try:
        yield c.up()
    finally:
        c.close()


def _submit(cluster: Cluster, user: LocalUser, *args: str) -> int:
    result = run_as(user, [str(BIN / "gsubmit"), "--parsable", *args], env=cluster.env,
                    cwd=cluster.work)
    assert result.returncode == 0, result
    return int(result.stdout)


def _tamper(db_url: str, sql: str, *params: object) -> None:
    """Change the database behind the controller's back, as only its owner can."""
    with psycopg.connect(db_url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(sql, params)


def _agent_alive(cluster: Cluster) -> None:
    assert cluster.procs["agent"].poll() is None, cluster.logs()
    log = (cluster.root / "agent.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]


def test_no_job_runs_as_root_by_default(strict_cluster: Cluster,
                                        attackers: tuple[LocalUser, LocalUser]) -> None:
    mallory, _ = attackers
    marker = strict_cluster.work / "root-ran"
    job_id = strict_cluster.submit("--wrap", f"touch {marker}")  # as root
    job = strict_cluster.wait_state(job_id, "FAILED", timeout=30)
    assert job["reason"] == "LaunchFailed", job
    accounting = strict_cluster.api("GET", f"/v1/accounting?ids={job_id}")["jobs"][0]
    assert "min_job_uid" in accounting["error_message"], accounting
    assert not marker.exists()
    _agent_alive(strict_cluster)
    ok = _submit(strict_cluster, mallory, "--wrap", "id -u")
    strict_cluster.wait_state(ok, "COMPLETED", timeout=30)


def test_tampered_jobs_fail_alone_and_the_agent_lives(
        strict_cluster: Cluster, db_url: str, attackers: tuple[LocalUser, LocalUser]) -> None:
    mallory, _ = attackers
    cluster = strict_cluster
    # The attack of an open database: a held job of the user's, turned into root's.
    as_root = _submit(cluster, mallory, "-H", "-o", "root-%j.out", "--wrap", "id -u")
    _tamper(db_url, "UPDATE jobs SET uid = 0, gid = 0 WHERE id = %s", as_root)
    # A pad width that submit refuses: root would build a huge name or raise.
    wide = _submit(cluster, mallory, "-H", "--wrap", "true")
    _tamper(db_url, "UPDATE jobs SET output = %s WHERE id = %s",
            "wide-%99999999999999999999j.out", wide)
    # An array task whose array spec the agent cannot read.
    array = _submit(cluster, mallory, "-H", "--array", "0-1", "--wrap", "true")
    _tamper(db_url, "UPDATE jobs SET array_spec = %s WHERE array_job_id = %s", "x-y", array)
    for job in (as_root, wide, array):
        cluster.api("POST", f"/v1/jobs/{job}/release", {})

    failed = cluster.wait_state(as_root, "FAILED", timeout=30)
    assert failed["reason"] == "LaunchFailed", failed
    assert not (cluster.work / f"root-{as_root}.out").exists()
    cluster.wait_state(wide, "COMPLETED", timeout=30)
    assert (cluster.work / f"wide-{wide:010d}.out").exists()
    tasks = [j for j in cluster.jobs() if j.get("array_job_id") == array]
    assert tasks
    for task in tasks:
        ended = cluster.wait_state(task["job_id"], "FAILED", timeout=30)
        assert ended["reason"] == "LaunchFailed", ended
        record = cluster.api("GET", f"/v1/accounting?ids={task['job_id']}")["jobs"][0]
        assert "refused the launch order: array_spec: invalid array 'x-y'" \
            in record["error_message"], record
    _agent_alive(cluster)
    after = _submit(cluster, mallory, "--wrap", "true")
    cluster.wait_state(after, "COMPLETED", timeout=30)
    _agent_alive(cluster)


def _serve_as(user: LocalUser, path: Path, status: bytes = b"200 OK",
              body_json: dict[str, Any] | None = None) -> tuple[int, int]:
    """A fake controller bound by ``user`` at ``path``: a forked child that answers
    every request with ``status`` and ``body_json`` (no work by default). Returns
    (pid, read end of a pipe that gets every byte it was sent)."""
    ready_r, ready_w = os.pipe()
    seen_r, seen_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(seen_r)
            os.setgroups([])
            os.setgid(user.gid)
            os.setuid(user.uid)
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(str(path))
            server.listen(8)
            os.write(ready_w, b"!")
            server.settimeout(20)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    break
                conn.settimeout(2)
                try:
                    os.write(seen_w, conn.recv(65536))
                    body = json.dumps(body_json if body_json is not None
                                      else {"commands": []}).encode()
                    conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                except OSError:
                    pass  # the client went away (the refusing agent closes at once)
                finally:
                    conn.close()
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(seen_w)
    assert os.read(ready_r, 1) == b"!"
    os.close(ready_r)
    return pid, seen_r


def test_the_agent_obeys_no_socket_a_user_bound(attackers: tuple[LocalUser, LocalUser]) -> None:
    mallory, _ = attackers
    root = Path(tempfile.mkdtemp(prefix="gpusched-fake-"))
    os.chmod(root, 0o777)
    path = root / "controller.sock"
    pid, seen = _serve_as(mallory, path)
    try:
        with pytest.raises(Unavailable, match=f"served by uid {mallory.uid}"):
            with ApiClient(path, timeout=5, trusted_server_uids=frozenset({0})) as client:
                client.request("GET", "/v1/ping")
        config = root / "agent.toml"
        config.write_text(f'[controller]\nsocket = "{path}"\n[agent]\nnode_name = "n1"\n'
                          f'state_dir = "{root / "agent"}"\n[agent.gpus]\nsource = "static"\n'
                          'count = 1\n')
        log = root / "agent.log"
        with open(log, "wb") as out:
            agent = subprocess.Popen([sys.executable, "-P", "-m", "gpusched.cli.gpusched",
                                      "agent", "--config", str(config)],
                                     stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        try:
            wait_for(lambda: "refusing the gpusched controller socket" in log.read_text(),
                     timeout=20, what="the agent to refuse the socket",
                     seen=lambda: log.read_text())
            assert agent.poll() is None
        finally:
            agent.terminate()
            agent.wait(timeout=20)
        # A client without the check is answered: the check alone kept the agent out.
        with ApiClient(path, timeout=5) as client:
            assert client.request("GET", "/v1/ping") == {"commands": []}
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    received = b""
    while chunk := os.read(seen, 65536):
        received += chunk
    os.close(seen)
    assert b"/agent/" not in received and received.count(b"GET /v1/ping") == 1
    subprocess.run(["rm", "-rf", str(root)], check=False)


def test_a_controller_fault_does_not_stop_the_agent(tmp_path: Path) -> None:
    """A 500 (or any refusal) from the controller: the agent logs it and tries again;
    it never exits and leaves its node's jobs unwatched."""
    root_user = LocalUser(0, 0, "root")
    path = tmp_path / "controller.sock"
    pid, seen = _serve_as(root_user, path, b"500 Internal Server Error",
                          {"error": {"code": "internal", "message": "a fault of the controller"}})
    config = tmp_path / "agent.toml"
    config.write_text(f'[controller]\nsocket = "{path}"\n[agent]\nnode_name = "n1"\n'
                      f'state_dir = "{tmp_path / "agent"}"\n[agent.gpus]\nsource = "static"\n'
                      'count = 1\n')
    log = tmp_path / "agent.log"
    try:
        with open(log, "wb") as out:
            agent = subprocess.Popen([sys.executable, "-P", "-m", "gpusched.cli.gpusched",
                                      "agent", "--config", str(config)],
                                     stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        try:
            wait_for(lambda: log.read_text().count("refused the agent's request") >= 2,
                     timeout=20, what="the agent to try again after a fault",
                     seen=lambda: log.read_text())
            assert agent.poll() is None, log.read_text()
            assert "Traceback" not in log.read_text()
        finally:
            agent.terminate()
            agent.wait(timeout=20)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(seen)
