"""A real cluster for end-to-end tests: controller and agent processes on a fresh database."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from gpusched.agent.cgroups import CgroupTree, JobCgroup
from gpusched.agent.confine import subtree_name
from gpusched.client import ApiClient
from tests.pg import ScratchPostgres

BIN = Path(sys.executable).parent
T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float = 20.0, what: str = "condition",
             seen: Callable[[], object] | None = None) -> T:
    """Poll ``check`` until it returns something truthy; fail showing what was seen."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            shown = seen() if seen else value
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last seen: {shown!r}")
        time.sleep(0.02)


def end_agent_jobs(state_dir: Path, node: str, remove: bool = True) -> None:
    """Kill everything an agent's jobs left behind, as a node that dies loses it all:
    the supervisors first (so that none is left halfway through freezing its job's
    cgroup), then each job's process group, then whatever is still in the agent's
    cgroups (thawed and killed; the cgroups removed unless ``remove`` is false, for an
    agent that will start again and find them)."""
    infos = []
    for path in state_dir.glob("jobs/*/supervisor.json"):
        try:
            infos.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass
    for key, kill in (("supervisor_pid", os.kill), ("job_pid", os.killpg)):
        for info in infos:
            try:
                kill(int(info[key]), signal.SIGKILL)
            except (OSError, KeyError, TypeError, ValueError):
                pass
    _end_agent_cgroups(subtree_name(node, state_dir), remove)


def _end_agent_cgroups(name: str, remove: bool) -> None:
    """Kill (freeze, kill, thaw) and, with ``remove``, remove the job cgroups of the
    agent whose subtree is ``name`` in the cgroup v1 hierarchies of this host, as its
    agent does for a lost supervisor."""
    subtrees = {p.parent.name: p for p in Path("/sys/fs/cgroup").glob(f"*/{name}")
                if p.is_dir()}
    jobs: dict[str, dict[str, Path]] = {}
    for controller, subtree in subtrees.items():
        for path in subtree.iterdir():
            if path.is_dir():
                jobs.setdefault(path.name, {})[controller] = path
    tree = CgroupTree(version=1, roots=subtrees)
    for job_name, paths in jobs.items():
        job = JobCgroup(tree, job_name, paths)
        try:
            job.kill(timeout=10.0, freeze=True)
            if remove:
                job.remove()
        except (OSError, TimeoutError):
            pass
    if remove:
        for path in subtrees.values():
            try:
                path.rmdir()
            except OSError:
                pass


class Cluster:
    """Controller + one agent with ``gpus`` static GPUs, all under one temp dir."""

    def __init__(self, database_url: str, gpus: int = 4, node: str = "node01",
                 kill_grace: float = 1.0, poll_wait: float = 5.0,
                 nvml: dict[str, str] | None = None, agent_toml: str = "",
                 gpus_toml: str = "", schedule_interval: float = 2.0,
                 min_job_uid: int = 0, listen: Sequence[str] = (),
                 controllers: Sequence[str] = (), auth_toml: str = "",
                 controller_toml: str = "") -> None:
        """``nvml``: the fake NVML library's environment (tests.nvml_fixture): the agent
        then discovers its GPUs through NVML instead of ``gpus`` static ones.
        ``min_job_uid`` is 0 because the tests submit as root. Cluster mode: the
        controller also ``listen``s on TCP, the agent reaches ``controllers`` over TCP,
        ``auth_toml`` is the [auth] table and ``controller_toml`` more [controller] keys."""
        self.root = Path(tempfile.mkdtemp(dir="/tmp", prefix="gpusched-e2e-"))
        os.chmod(self.root, 0o755)
        self.socket = self.root / "c.sock"
        self.agent_state = self.root / "agent"
        self.node = node
        self.extra_agents: list[tuple[Path, str]] = []  # (state dir, node) of more agents
        self.work = self.root / "work"
        self.work.mkdir(mode=0o777)
        os.chmod(self.work, 0o777)
        self.config = self.root / "gpusched.toml"
        self.config.write_text(f"""
controllers = {json.dumps(list(controllers))}
[database]
url = "{database_url}"
[controller]
socket = "{self.socket}"
schedule_interval = {schedule_interval}
listen = {json.dumps(list(listen))}
{controller_toml}
[agent]
node_name = "{node}"
min_job_uid = {min_job_uid}
state_dir = "{self.agent_state}"
poll_wait = {poll_wait}
kill_grace = {kill_grace}
{agent_toml}
[agent.gpus]
{'source = "nvml"' if nvml else f'source = "static"{chr(10)}count = {gpus}'}
{gpus_toml}
[[partitions]]
name = "gpu"
default = true
max_time = "1-00:00:00"
[[partitions]]
name = "debug"
nodes = ["{node}"]
{auth_toml}
""")
        self.env = {**os.environ, "GPUSCHED_SOCKET": str(self.socket)}
        self.agent_env = {**self.env, **(nvml or {})}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- daemons -------------------------------------------------------------
    def start(self, daemon: str, config: Path | None = None) -> subprocess.Popen[bytes]:
        """Start ``controller`` or ``agent`` as a real process, logging to the temp dir
        (with another ``config`` than the cluster's, if given)."""
        log = open(self.root / f"{daemon}.log", "ab")
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "gpusched.cli.gpusched", daemon, "--config",
             str(config or self.config)],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL,
            env=self.agent_env if daemon == "agent" else self.env,
        )
        log.close()
        self.procs[daemon] = proc
        return proc

    def start_standby(self, listen: Sequence[str] | None = None) -> Path:
        """A second controller on the same database, on its own socket (and TCP
        addresses, ``listen``); returns the socket."""
        socket = self.root / "standby.sock"
        config = self.root / "standby.toml"
        text = self.config.read_text().replace(f'"{self.socket}"', f'"{socket}"')
        if listen is not None:
            text = re.sub(r"(?m)^listen = .*$", f"listen = {json.dumps(list(listen))}", text)
        config.write_text(text)
        log = open(self.root / "standby.log", "ab")
        self.procs["standby"] = subprocess.Popen(
            [sys.executable, "-P", "-m", "gpusched.cli.gpusched", "controller", "--config", str(config)],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=self.env,
        )
        log.close()
        return socket

    def kill(self, daemon: str, sig: int = signal.SIGKILL) -> None:
        """Signal a daemon and wait for it to exit."""
        proc = self.procs.pop(daemon)
        proc.send_signal(sig)
        proc.wait(timeout=20)

    def up(self) -> Cluster:
        """Start both daemons and wait until the node is UP."""
        self.start("controller")
        self.wait_controller()
        self.start("agent")
        self.wait_node_up()
        return self

    def wait_controller(self) -> None:
        """Wait until the controller answers."""
        wait_for(lambda: self.try_api("GET", "/v1/ping"), what="controller", seen=self.logs)

    def wait_node_up(self) -> None:
        """Wait until the agent's node is registered and UP."""
        def up() -> bool:
            nodes = self.try_api("GET", "/v1/nodes")
            return bool(nodes and any(n["state"] == "UP" for n in nodes["nodes"]))
        wait_for(up, what="node UP", seen=self.logs)

    def logs(self) -> str:
        """The tails of the daemon logs, for failure messages."""
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.root.glob("*.log"))

    def close(self) -> None:
        """Stop daemons and any job still running, remove the temp dir."""
        for daemon in list(self.procs):
            self.kill(daemon, signal.SIGTERM)
        for state_dir, node in [(self.agent_state, self.node), *self.extra_agents]:
            end_agent_jobs(state_dir, node)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- API and CLIs ---------------------------------------------------------
    def api(self, method: str, path: str, body: dict[str, Any] | None = None,
            socket: Path | None = None) -> dict[str, Any]:
        """One API request as the test process's user (to another controller's ``socket``)."""
        with ApiClient(socket or self.socket, timeout=30) as client:
            return client.request(method, path, body)

    def try_api(self, method: str, path: str, socket: Path | None = None) -> dict[str, Any] | None:
        """Like api() but None while the controller is unreachable."""
        try:
            return self.api(method, path, socket=socket)
        except Exception:
            return None

    def job(self, job_id: int) -> dict[str, Any]:
        """The JOB object of ``job_id``."""
        return self.api("GET", f"/v1/jobs/{job_id}")

    def jobs(self) -> list[dict[str, Any]]:
        """Every job, ended ones included."""
        return self.api("GET", "/v1/jobs?all=1")["jobs"]

    def run(self, cmd: str, *args: str, user: str | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run one of the console scripts (gsubmit, gqueue, gcancel) as a subprocess."""
        return subprocess.run(
            [str(BIN / cmd), *args], capture_output=True, text=True, env=self.env,
            cwd=cwd or self.work, user=user, timeout=60,
        )

    def api_as(self, uid: int, gid: int, method: str, path: str,
               body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One API request from a forked child running as ``uid``: the controller sees
        that uid through SO_PEERCRED. Returns the body, or ``{"error": message}``."""
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: drop privileges, ask, send the answer back, leave at once
            try:
                os.close(read_end)
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
                try:
                    answer: dict[str, Any] = self.api(method, path, body)
                except Exception as exc:  # reported to the parent, which asserts on it
                    answer = {"error": str(exc)}
                os.write(write_end, json.dumps(answer).encode())
            finally:
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            data = pipe.read()
        os.waitpid(pid, 0)
        return json.loads(data)

    def submit(self, *args: str, user: str | None = None, cwd: Path | None = None) -> int:
        """gsubmit --parsable ARGS; returns the job id."""
        result = self.run("gsubmit", "--parsable", *args, user=user, cwd=cwd)
        assert result.returncode == 0, f"gsubmit failed: {result.stderr}"
        return int(result.stdout.strip())

    def wait_state(self, job_id: int, *states: str, timeout: float = 20.0) -> dict[str, Any]:
        """Wait until the job is in one of ``states``; returns its JOB object."""
        def reached() -> dict[str, Any] | None:
            job = self.job(job_id)
            return job if job["state"] in states else None
        return wait_for(reached, timeout, f"job {job_id} in {states}",
                        seen=lambda: (self.job(job_id), self.logs()))


@contextmanager
def scratch_cluster(**options: Any) -> Iterator[tuple[Cluster, str]]:
    """A cluster (``Cluster``'s ``options``) up on a PostgreSQL of its own, and the
    database's URL; both are stopped and removed on leaving (the benches' set-up)."""
    pg = ScratchPostgres()
    try:
        url = pg.fresh_database()
        cluster = Cluster(url, **options)
        try:
            cluster.up()
            yield cluster, url
        finally:
            cluster.close()
    finally:
        pg.close()
