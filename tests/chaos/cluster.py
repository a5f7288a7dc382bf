"""A multi-node local cluster to inject faults into.

A PostgreSQL server of its own (killed with SIGKILL and started again), two controllers
on one database (whichever holds the leadership, and a standby), each on a Unix socket
and a loopback TCP port, and one agent per node that reaches both controllers over TCP
with its node's key, its state directory on a small tmpfs of its own (so that the disk
can be filled). One node discovers its GPUs through the fake NVML library, MIG slices
included. A keeper restarts any daemon that exits while it should run, as a service
manager would, and counts each such exit.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpusched.auth.keys import (
    derive_host_key,
    new_master_key,
    render_host_key,
    render_master_key,
    write_key_file,
)
from gpusched.client import ApiClient
from gpusched.errors import Unavailable
from tests.chaos.processes import Daemon, Postgres, _free_port
from tests.e2e.cluster import BIN, end_agent_jobs
from tests.nvml_fixture import FakeNvml

NODE_TIMEOUT = 4.0  # seconds of silence before a node is lost: shorter than most pauses
POLL_WAIT = 1.0
SCHEDULE_INTERVAL = 1.0
STATE_DISK_MB = 24  # each agent's state directory: a tmpfs this size
PAGE = 4096  # what a tmpfs counts its room in
RESPAWN_AFTER = 0.5  # seconds the keeper leaves between two starts of one daemon
CONTROLLERS = ("ctl-a", "ctl-b")
MIG_INVENTORY = "mixed_mig.json"  # two GPUs cut in MIG slices, two whole
# The admin set-up: a partition that shares node3's GPUs by shards, and a QOS that
# preempts the jobs of the default one (docs/faults.md).
ADMIN = """
[[partition]]
name = "gpu"
default = true
[[partition]]
name = "shared"
nodes = "{shared}"
sharing = "shard"
[[account]]
name = "ops"
[[user]]
name = "root"
accounts = ["ops"]
[[qos]]
name = "normal"
[[qos]]
name = "high"
priority = 100
preempt = ["normal"]
"""


class ChaosCluster:
    """PostgreSQL, controllers ctl-a and ctl-b, agents node1..nodeN under one temp dir."""

    def __init__(self, nodes: int = 4, gpus: int = 2, nvml_lib: Path | None = None,
                 state_disk_mb: int | None = STATE_DISK_MB) -> None:
        """``nvml_lib``: the built fake NVML library; the last node then has the MIG
        inventory. ``state_disk_mb`` None: state directories on the ordinary disk."""
        if nodes < 2:
            raise ValueError("a chaos cluster needs at least two nodes")
        self.root = Path(tempfile.mkdtemp(dir="/tmp", prefix="gpusched-chaos-"))
        os.chmod(self.root, 0o755)
        self.records = self._open_dir("records")
        self.work = self._open_dir("work")
        self.nodes = [f"node{i}" for i in range(1, nodes + 1)]
        self.gpus = gpus
        self.mig_node = self.nodes[-1] if nvml_lib is not None else None
        # The node whose GPUs the "shared" partition shares by shards.
        self.shared_node = self.nodes[-2] if self.mig_node else self.nodes[-1]
        self.nvml = (FakeNvml(nvml_lib, MIG_INVENTORY, self.root / "nvml.faults")
                     if nvml_lib is not None else None)
        self.state_disk_mb = state_disk_mb
        self.mounts: list[Path] = []
        self.fills: dict[str, Path] = {}
        self.postgres: Postgres | None = None
        self.daemons: dict[str, Daemon] = {}
        self.sockets = {name: self.root / f"{name}.sock" for name in CONTROLLERS}
        self.lock = threading.RLock()  # daemons change under it (keeper and faults)
        self._keeper_stop = threading.Event()
        self._keeper = threading.Thread(target=self._keep, daemon=True, name="keeper")

    def _open_dir(self, name: str) -> Path:
        path = self.root / name
        path.mkdir()
        os.chmod(path, 0o777)
        return path

    def state_dir(self, node: str) -> Path:
        return self.root / "state" / node

    @property
    def url(self) -> str:
        assert self.postgres is not None
        return self.postgres.url

    # -- set-up ---------------------------------------------------------------
    def start(self, timeout: float = 90.0) -> None:
        """Everything up: the database, ctl-a (the first leader), the admin set-up,
        ctl-b, every agent; returns once every node is UP."""
        self.postgres = Postgres()
        keys = self.root / "keys"
        keys.mkdir(mode=0o700)
        master = new_master_key()
        write_key_file(keys / "master.key", render_master_key(master))
        ports = {name: _free_port() for name in CONTROLLERS}
        env = {k: v for k, v in os.environ.items()
               if k not in ("GPUSCHED_SOCKET", "GPUSCHED_CONTROLLERS", "GPUSCHED_CONFIG")}
        for name in CONTROLLERS:
            config = self.root / f"{name}.toml"
            config.write_text(self._controller_toml(name, ports[name], keys / "master.key"))
            self.daemons[name] = Daemon(name, self._argv("controller", config), env,
                                        self.root / f"{name}.log")
        for node in self.nodes:
            write_key_file(keys / f"{node}.key", render_host_key(derive_host_key(master, node)))
            state = self.state_dir(node)
            state.mkdir(parents=True)
            if self.state_disk_mb:
                subprocess.run(["mount", "-t", "tmpfs", "-o",
                                f"size={self.state_disk_mb}m,mode=0755", "tmpfs", str(state)],
                               check=True, capture_output=True)
                self.mounts.append(state)
            config = self.root / f"{node}.toml"
            config.write_text(self._agent_toml(node, ports, keys / f"{node}.key"))
            agent_env = {**env, **(self.nvml.variables(env) if node == self.mig_node
                                   and self.nvml else {})}
            self.daemons[f"agent-{node}"] = Daemon(f"agent-{node}", self._argv("agent", config),
                                                   agent_env, self.root / f"agent-{node}.log")
        self.restart("ctl-a")
        self._wait(lambda: self.ping("ctl-a", 2.0), timeout, "ctl-a to answer")
        admin = self.root / "admin.toml"
        admin.write_text(ADMIN.format(shared=self.shared_node))
        applied = subprocess.run([str(BIN / "gpusched"), "admin", "apply", str(admin)],
                                 check=False, capture_output=True, text=True, timeout=60,
                                 env={**env, "GPUSCHED_SOCKET": str(self.sockets["ctl-a"])})
        assert applied.returncode == 0, f"admin apply: {applied.stderr}"
        self.restart("ctl-b")
        for node in self.nodes:
            self.restart(f"agent-{node}")
        self._wait(lambda: self.ping("ctl-b", 2.0), timeout, "ctl-b to answer")
        self._wait(self.all_nodes_up, timeout, "every node UP")
        self._keeper.start()

    @staticmethod
    def _argv(daemon: str, config: Path) -> list[str]:
        return [sys.executable, "-P", "-m", "gpusched.cli.gpusched", daemon, "--config",
                str(config)]

    def _controller_toml(self, name: str, port: int, master: Path) -> str:
        return f"""
[database]
url = "{self.url}"
[controller]
socket = "{self.sockets[name]}"
schedule_interval = {SCHEDULE_INTERVAL}
node_timeout = {NODE_TIMEOUT}
listen = ["127.0.0.1:{port}"]
[agent]
poll_wait = {POLL_WAIT}
[auth]
method = "key"
key_file = "{master}"
[[partitions]]
name = "gpu"
default = true
max_time = "1-00:00:00"
"""

    def _agent_toml(self, node: str, ports: dict[str, int], key: Path) -> str:
        controllers = json.dumps([f"127.0.0.1:{ports[name]}" for name in CONTROLLERS])
        gpus = ('source = "nvml"\nrediscover_interval = 60' if node == self.mig_node
                else f'source = "static"\ncount = {self.gpus}')
        return f"""
controllers = {controllers}
[controller]
node_timeout = {NODE_TIMEOUT}
[agent]
node_name = "{node}"
min_job_uid = 0
state_dir = "{self.state_dir(node)}"
poll_wait = {POLL_WAIT}
kill_grace = 1.0
[agent.gpus]
{gpus}
[auth]
method = "key"
host_key_file = "{key}"
"""

    # -- the keeper -------------------------------------------------------------
    def _keep(self) -> None:
        while not self._keeper_stop.wait(0.2):
            with self.lock:
                for daemon in self.daemons.values():
                    if (daemon.wanted and daemon.proc is not None
                            and daemon.proc.poll() is not None
                            and time.monotonic() - daemon.spawned_at > RESPAWN_AFTER):
                        daemon.self_exits.append((time.time(), daemon.proc.returncode))
                        daemon.spawn()

    def self_exits(self) -> dict[str, int]:
        """How often each daemon exited by itself (restarted by the keeper)."""
        return {name: len(d.self_exits) for name, d in self.daemons.items() if d.self_exits}

    # -- faults -----------------------------------------------------------------
    def kill(self, name: str) -> bool:
        """kill -9 of one daemon (an agent's supervisors and jobs live on)."""
        with self.lock:
            daemon = self.daemons[name]
            daemon.wanted = False
            was = daemon.alive()
            daemon.kill()
            return was

    def restart(self, name: str) -> None:
        """Start a daemon again (nothing if it runs)."""
        with self.lock:
            daemon = self.daemons[name]
            daemon.wanted = True
            if not daemon.alive():
                daemon.spawn()

    def pause(self, name: str) -> bool:
        with self.lock:
            return self.daemons[name].send(signal.SIGSTOP)

    def resume(self, name: str) -> bool:
        with self.lock:
            return self.daemons[name].send(signal.SIGCONT)

    def node_dies(self, node: str) -> float:
        """The whole node dies: its agent, every supervisor and job, at once; returns
        the time."""
        with self.lock:
            daemon = self.daemons[f"agent-{node}"]
            daemon.wanted = False
            if daemon.proc is not None and daemon.proc.poll() is None:
                daemon.proc.send_signal(signal.SIGKILL)
            at = time.time()
            end_agent_jobs(self.state_dir(node), node, remove=False)
            daemon.kill()
            return at

    def fill_disk(self, node: str, leave: int = 0) -> int:
        """Fill the node's state disk with one file, leaving ``leave`` bytes (whole
        pages) free; returns the bytes the file holds."""
        path = self.state_dir(node) / "chaos-fill"
        chunk = b"\0" * (1 << 20)
        written = 0
        with open(path, "wb", buffering=0) as f:
            self.fills[node] = path
            try:
                while written < (self.state_disk_mb or 0) << 21:  # bounded: twice the size
                    written += f.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
            if leave:
                written = max(0, written // PAGE * PAGE - leave)
                f.truncate(written)
        return written

    def free_disk(self, node: str) -> None:
        path = self.fills.pop(node, None)
        if path is not None:
            path.unlink(missing_ok=True)

    def leader(self) -> str | None:
        """The controller that says it leads, if one answers so within a second."""
        for name in CONTROLLERS:
            answer = self.ping(name, 1.0)
            if answer and answer.get("leader"):
                return name
        return None

    # -- API --------------------------------------------------------------------
    def ping(self, name: str, timeout: float) -> dict[str, Any] | None:
        try:
            with ApiClient(self.sockets[name], timeout=timeout) as client:
                return client.request("GET", "/v1/ping")
        except Exception:  # noqa: BLE001 - down, paused or without its database
            return None

    def api(self, method: str, path: str, body: dict[str, Any] | None = None,
            timeout: float = 10.0) -> dict[str, Any]:
        """One request to the first controller that answers it."""
        error: Exception | None = None
        for name in CONTROLLERS:
            try:
                with ApiClient(self.sockets[name], timeout=timeout) as client:
                    return client.request(method, path, body)
            except Exception as exc:  # noqa: BLE001 - the other may answer
                error = exc
        raise Unavailable(f"no controller answered {method} {path}: {error}")

    def all_nodes_up(self) -> bool:
        try:
            nodes = self.api("GET", "/v1/nodes", timeout=3.0)["nodes"]
        except Unavailable:
            return False
        states = {n["name"]: n["state"] for n in nodes}
        return all(states.get(node) == "UP" for node in self.nodes)

    # -- the end ----------------------------------------------------------------
    def settle(self, timeout: float = 60.0) -> None:
        """Every fault undone: processes resumed, disks freed, the database and every
        daemon running, both controllers answering, one of them leading, every node UP."""
        with self.lock:
            for name in list(self.fills):
                self.free_disk(name)
            for daemon in self.daemons.values():
                daemon.send(signal.SIGCONT)
        assert self.postgres is not None
        if not self.postgres.up():
            self.postgres.start()
        for name in self.daemons:
            self.restart(name)
        self._wait(lambda: all(self.ping(n, 2.0) for n in CONTROLLERS), timeout,
                   "both controllers to answer")
        self._wait(self.leader, timeout, "a leader")
        self._wait(self.all_nodes_up, timeout, "every node UP")

    def _wait(self, check: Callable[[], object], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            ended = [d.name for d in self.daemons.values()
                     if d.wanted and d.proc is not None and d.proc.poll() is not None]
            if time.monotonic() > deadline or (ended and not self._keeper.is_alive()):
                raise AssertionError(f"waiting for {what}: timed out after {timeout}s or "
                                     f"{ended} exited\n"
                                     f"{self.logs()}")
            time.sleep(0.1)

    def logs(self, tail: int = 3000) -> str:
        """The tails of the daemons' logs, for failure messages."""
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}"
                         for p in sorted(self.root.glob("*.log")))

    def close(self) -> None:
        """Stop everything and remove it all: daemons, jobs, cgroups, mounts, the
        database server, the temp dir. Safe to call after any failure."""
        self._keeper_stop.set()
        if self._keeper.is_alive():
            self._keeper.join(timeout=10)
        with self.lock:
            for daemon in self.daemons.values():
                daemon.terminate()
            for daemon in self.daemons.values():
                try:
                    daemon.reap()
                except (OSError, subprocess.TimeoutExpired):
                    pass
            for node in self.nodes:
                end_agent_jobs(self.state_dir(node), node)
            for path in reversed(self.mounts):
                if subprocess.run(["umount", str(path)], check=False,
                                  capture_output=True).returncode:  # busy: detach it
                    subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)
            self.mounts.clear()
        if self.postgres is not None:
            self.postgres.close()
        shutil.rmtree(self.root, ignore_errors=True)
