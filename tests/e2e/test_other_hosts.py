"""Agents on other hosts: each in a network namespace of its own, reaching the
controller over TCP from an address of its own with its node's key credentials. A
partition of the network is a node failure: the node's job ends NODE_FAIL and runs
again elsewhere; when the link comes back, the node kills the run the controller
ended, and the job's current run is untouched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.auth.keys import (
    derive_host_key,
    new_master_key,
    render_host_key,
    render_master_key,
    write_key_file,
)
from tests.e2e.cluster import Cluster, end_agent_jobs, wait_for
from tests.netns import NetNamespace

NODE_TIMEOUT = 6
PORT = 6820


@pytest.fixture
def hosts() -> Iterator[list[NetNamespace]]:
    made: list[NetNamespace] = []
    try:
        made.extend(NetNamespace(i) for i in (1, 2))
        yield made
    finally:
        for ns in made:
            ns.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


class OtherHosts:
    """A controller on this host listening on each namespace's link, and one agent in
    each namespace."""

    def __init__(self, db_url: str, hosts: list[NetNamespace]) -> None:
        self.hosts = hosts
        self.names = [f"far{i + 1}" for i in range(len(hosts))]
        self.cluster = Cluster(
            db_url, poll_wait=2.0, schedule_interval=1.0,
            listen=[f"{ns.host_address}:{PORT}" for ns in hosts],
            controller_toml=f"node_timeout = {NODE_TIMEOUT}\n",
            auth_toml="")  # replaced below, once the keys exist
        root = self.cluster.root
        keys = root / "keys"
        keys.mkdir(mode=0o700)
        master = new_master_key()
        write_key_file(keys / "master.key", render_master_key(master))
        for name in self.names:
            write_key_file(keys / f"{name}.key", render_host_key(derive_host_key(master, name)))
        text = self.cluster.config.read_text()
        self.cluster.config.write_text(
            text + f'\n[auth]\nmethod = "key"\nkey_file = "{keys / "master.key"}"\n')
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.configs = {}
        for name, ns in zip(self.names, hosts, strict=True):
            config = root / f"{name}.toml"
            config.write_text(f"""
controllers = ["{ns.host_address}:{PORT}"]
[controller]
node_timeout = {NODE_TIMEOUT}
[agent]
node_name = "{name}"
min_job_uid = 0
state_dir = "{root / name}"
poll_wait = 2.0
kill_grace = 1.0
[agent.gpus]
source = "static"
count = 2
[auth]
method = "key"
host_key_file = "{keys / (name + '.key')}"
""")
            self.configs[name] = config

    def start(self) -> None:
        self.cluster.start("controller")
        self.cluster.wait_controller()
        for name, ns in zip(self.names, self.hosts, strict=True):
            log = open(self.cluster.root / f"agent-{name}.log", "ab")
            env = {k: v for k, v in os.environ.items() if k != "GPUSCHED_SOCKET"}
            self.agents[name] = ns.popen([sys.executable, "-P", "-m", "gpusched.cli.gpusched",
                                          "agent", "--config", str(self.configs[name])],
                                         env=env, stdout=log, stderr=log)
            log.close()
        wait_for(lambda: self.states() == {n: "UP" for n in self.names}, timeout=30,
                 what="both far nodes UP", seen=self.cluster.logs)

    def states(self) -> dict[str, str]:
        nodes = self.cluster.try_api("GET", "/v1/nodes")
        return {n["name"]: n["state"] for n in (nodes or {}).get("nodes", [])
                if n["name"] in self.names}

    def node(self, name: str) -> dict[str, Any]:
        return next(n for n in self.cluster.api("GET", "/v1/nodes")["nodes"]
                    if n["name"] == name)

    def close(self) -> None:
        for proc in self.agents.values():
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for name in self.names:
            end_agent_jobs(self.cluster.root / name, name)
        self.cluster.close()


def _runs(path: Path) -> list[tuple[int, int]]:
    """(restart count, pid) of each run the job's script recorded."""
    if not path.exists():
        return []
    return [(int(a), int(b)) for a, b in (line.split() for line in path.read_text().splitlines())]


def test_a_partitioned_node_fails_its_job_over_and_fences_the_stale_run(
        db_url: str, hosts: list[NetNamespace]) -> None:
    far = OtherHosts(db_url, hosts)
    try:
        far.start()
        runs = far.cluster.work / "runs"
        job_id = far.cluster.submit("--gpus", "1", "--wrap",
                                    f"echo $SLURM_RESTART_COUNT $$ >> {runs}; exec sleep 300")
        job = far.cluster.wait_state(job_id, "RUNNING", timeout=30)
        wait_for(lambda: len(_runs(runs)) == 1, what="the first run", seen=far.cluster.logs)
        first_node = job["node"]
        assert first_node in far.names, job
        cut = far.hosts[far.names.index(first_node)]
        (restarts0, first_pid), = _runs(runs)
        assert restarts0 == 0

        # Pull the cable: the node is lost, its job runs again on the other node.
        subprocess.run(["ip", "link", "set", cut.host_if, "down"], check=True)
        cut_at = time.monotonic()
        wait_for(lambda: len(_runs(runs)) == 2, timeout=NODE_TIMEOUT + 30,
                 what="the job to run again elsewhere", seen=far.cluster.logs)
        requeued_after = time.monotonic() - cut_at
        print(f"partition_to_rerun_s: {requeued_after:.1f}")
        lost = far.node(first_node)
        assert lost["state"] == "DOWN" and lost["reason"] == "NotResponding", lost
        again = far.cluster.job(job_id)
        assert again["state"] == "RUNNING" and again["restarts"] == 1, again
        assert again["node"] != first_node and again["node"] in far.names, again
        second_pid = _runs(runs)[1][1]
        assert _alive(first_pid), "the cut-off node keeps its run until it can be told"

        # The link comes back: the node kills the run the controller ended, and only it.
        subprocess.run(["ip", "link", "set", cut.host_if, "up"], check=True)
        wait_for(lambda: not _alive(first_pid), timeout=60,
                 what="the stale run to be killed", seen=far.cluster.logs)
        wait_for(lambda: far.node(first_node)["state"] == "UP", timeout=30,
                 what="the node back UP", seen=far.cluster.logs)
        assert _alive(second_pid)
        final = far.cluster.job(job_id)
        assert final["state"] == "RUNNING" and final["restarts"] == 1, final
        assert len(_runs(runs)) == 2  # ran exactly once more, never a third time
        assert requeued_after < NODE_TIMEOUT + 15, requeued_after
    finally:
        far.close()
