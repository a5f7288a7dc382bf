"""`gpusched up` gives a working cluster from nothing; the CLIs find it with no flags."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import wait_for

BIN = Path(sys.executable).parent


@pytest.fixture
def state_home() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="gpusched-up-"))
    os.chmod(root, 0o755)  # the PostgreSQL user must reach the data directory
    yield root
    env = {**os.environ, "XDG_STATE_HOME": str(root)}
    env.pop("GPUSCHED_SOCKET", None)
    subprocess.run([str(BIN / "gpusched"), "down"], env=env, capture_output=True, timeout=120)
    shutil.rmtree(root, ignore_errors=True)


def test_up_submit_down(state_home: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(state_home)}
    env.pop("GPUSCHED_SOCKET", None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / args[0]), *args[1:]], env=env, capture_output=True,
                              text=True, cwd=state_home, timeout=180)

    # --demo: 3 made-up GPUs, also on a host where NVML finds real ones (up would use those)
    first = run("gpusched", "up", "--demo", "--gpus", "3")
    assert first.returncode == 0, first.stderr
    assert "started PostgreSQL" in first.stdout and "started the controller" in first.stdout
    assert "gsubmit" in first.stdout  # tells how to submit a first job
    assert (state_home / "gpusched" / "controller.sock").exists()

    again = run("gpusched", "up", "--demo", "--gpus", "3")
    assert again.returncode == 0 and "already running" in again.stdout, again

    submitted = run("gsubmit", "--parsable", "--gpus", "3", "--wrap", "echo $CUDA_VISIBLE_DEVICES")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    out = state_home / f"gpusched-{job_id}.out"
    wait_for(lambda: out.exists() and out.read_text().strip(), what="job output")
    assert out.read_text().strip().count("GPU-") == 3

    queue = run("gqueue", "--all", "--json")
    assert queue.returncode == 0, queue.stderr
    assert '"job_id": ' + job_id in queue.stdout or f'"job_id":{job_id}' in queue.stdout

    stopped = run("gpusched", "down")
    assert stopped.returncode == 0
    assert "stopped the controller" in stopped.stdout and "stopped PostgreSQL" in stopped.stdout
    assert run("gqueue").returncode == 1  # nothing answers any more

    demo = run("gpusched", "up", "--gpus", "2")  # the data survived: same job is there
    assert demo.returncode == 0, demo.stderr
    shown = run("gpusched", "demo")
    assert shown.returncode == 0, shown.stderr
    assert "CUDA_VISIBLE_DEVICES=GPU-" in shown.stdout
    history = run("gqueue", "--all", "--json")
    assert f'"job_id": {job_id}' in history.stdout or f'"job_id":{job_id}' in history.stdout


def test_up_foreground_stays_attached_and_ctrl_c_stops_the_cluster(state_home: Path) -> None:
    import signal

    from gpusched.client import ApiClient

    env = {**os.environ, "XDG_STATE_HOME": str(state_home)}
    env.pop("GPUSCHED_SOCKET", None)
    sock = state_home / "gpusched" / "controller.sock"
    proc = subprocess.Popen([str(BIN / "gpusched"), "up", "--foreground", "--gpus", "1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def nodes_up() -> bool:
            try:
                with ApiClient(sock, timeout=5) as client:
                    return any(n["state"] == "UP" for n in client.request("GET", "/v1/nodes")["nodes"])
            except Exception:
                return False
        wait_for(nodes_up, timeout=120, what="the foreground cluster")
        assert proc.poll() is None  # still attached
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stopped the agent" in out and "stopped PostgreSQL" in out
    assert not sock.exists()


def test_up_with_several_nodes_runs_a_multi_node_job(state_home: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(state_home)}
    env.pop("GPUSCHED_SOCKET", None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / args[0]), *args[1:]], env=env, capture_output=True,
                              text=True, cwd=state_home, timeout=180)

    first = run("gpusched", "up", "--nodes", "4", "--gpus", "2")
    assert first.returncode == 0, first.stderr
    for i in range(1, 5):
        assert f"started the agent of node{i}" in first.stdout, first.stdout
    info = run("ginfo", "--json")
    assert info.returncode == 0, info.stderr
    assert {f"node{i}" for i in range(1, 5)} <= set(info.stdout.replace('"', " ").split())
    submitted = run("gsubmit", "--parsable", "-N", "2", "--gpus", "4", "--wrap",
                    "echo $SLURM_JOB_NODELIST $CUDA_VISIBLE_DEVICES")
    assert submitted.returncode == 0, submitted.stderr
    out = state_home / f"gpusched-{submitted.stdout.strip()}.out"
    wait_for(lambda: out.exists() and out.read_text().strip(), what="job output")
    nodelist = out.read_text().split()[0]
    assert nodelist.startswith("node") and ("," in nodelist or "[" in nodelist), nodelist
    config = state_home / "gpusched" / "agents" / "node3.toml"
    assert oct(config.stat().st_mode & 0o777) == "0o600"
    # The agents reach the controller over TCP with credentials of their own node, as
    # agents on other hosts do: none of them has the controller's socket.
    assert "TCP 127.0.0.1:" in first.stdout, first.stdout
    agent_toml = config.read_text()
    assert 'controllers = ["127.0.0.1:' in agent_toml and 'method = "key"' in agent_toml
    assert "node3.key" in agent_toml and "master.key" not in agent_toml
    keys = state_home / "gpusched" / "auth"
    assert oct(keys.stat().st_mode & 0o777) == "0o700"
    assert all(oct(k.stat().st_mode & 0o777) == "0o600" for k in keys.iterdir())
    port = first.stdout.split("TCP 127.0.0.1:")[1].split(" ")[0].rstrip(",)")
    with socket.create_connection(("127.0.0.1", int(port)), timeout=5) as conn:
        conn.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n")
        assert conn.recv(4096).startswith(b"HTTP/1.1 401")  # no credential, no answer
    stopped = run("gpusched", "down")
    assert stopped.returncode == 0
    assert stopped.stdout.count("stopped the agent") == 4, stopped.stdout
    for i in range(1, 5):
        assert not (state_home / "gpusched" / f"agent-node{i}.pid").exists()
