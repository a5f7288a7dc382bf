"""``gpusched up`` / ``gpusched down``: a whole cluster on this machine.

Layout of the state directory (see ``paths.local_state_dir``)::

    gpusched.toml     the generated configuration the daemons run with (0600)
    pgdata/  pg/      embedded PostgreSQL data and its socket directory (both 0700)
    pg-socket-dir     where the socket directory is instead, when pg/ is too long a path
    postgres.log      the embedded PostgreSQL's log (0600)
    controller.sock   the API socket the CLIs find with no flags
    agent/            the agent's state (one directory per running job)
    logs/             controller.log, agent.log (0600)
    agents/           with --nodes N: one configuration and state directory per node
    auth/             with --nodes N: the key method's master key and one key per node
    controller.pid  agent.pid  (agent-node1.pid ... with --nodes N)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gpusched.errors import Unavailable
from gpusched.localdb import DATABASE as DATABASE
from gpusched.localdb import configured_database_url, embedded_server, start_database
from gpusched.localdb import pg_socket_dir as pg_socket_dir
from gpusched.paths import SOCKET_NAME, local_state_dir

READY_TIMEOUT = 60.0


@dataclass(frozen=True)
class LocalCluster:
    """Paths of one local cluster."""

    state_dir: Path

    @property
    def config_file(self) -> Path:
        return self.state_dir / "gpusched.toml"

    @property
    def socket(self) -> Path:
        return self.state_dir / SOCKET_NAME

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    @property
    def pg_socket_record(self) -> Path:
        """Names the socket directory made in /tmp when the state path is too long."""
        return self.state_dir / "pg-socket-dir"

    def agent_config(self, node: str) -> Path:
        """The configuration of one of several local agents (``--nodes``)."""
        return self.state_dir / "agents" / f"{node}.toml"

    def pidfile(self, daemon: str) -> Path:
        return self.state_dir / f"{daemon}.pid"

    def pid(self, daemon: str) -> int | None:
        """The pid of a running daemon, or None."""
        try:
            pid = int(self.pidfile(daemon).read_text())
            os.kill(pid, 0)
        except (FileNotFoundError, ValueError, ProcessLookupError):
            return None
        except PermissionError:
            pass
        return pid


def _private_fd(path: Path, flags: int) -> int:
    """Open ``path`` for writing, created 0600 and made 0600; a link is never followed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | flags, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def _root_jobs_line() -> str:
    """The agent's ``min_job_uid`` line: a local cluster that root started runs root's jobs."""
    return "min_job_uid = 0\n" if os.geteuid() == 0 else ""


def node_names(nodes: int) -> list[str]:
    """The agents' node names: this host's name for one, ``node1``... for several (as
    Slurm's several slurmd on one host each take a NodeName of their own)."""
    if nodes == 1:
        return [socket.gethostname().split(".")[0] or "localhost"]
    return [f"node{i}" for i in range(1, nodes + 1)]


@dataclass(frozen=True)
class _Network:
    """How the agents of a several-node cluster reach the controller: TCP on loopback,
    each request with a credential of the key method; a key per node name."""

    port: int
    master_key: Path
    node_keys: Path  # directory of <node>.key


@dataclass(frozen=True)
class GpuChoice:
    """Where the agents' GPUs come from: ``nvml`` (this host's, discovered by the agent)
    or ``static`` (``count`` made-up demo GPUs); ``line`` says which, and why."""

    source: str
    count: int
    line: str


def choose_gpus(demo: bool, gpus: int, nodes: int) -> GpuChoice:
    """The GPUs a local cluster runs with: this host's through NVML when it has any,
    the demo inventory when it has none, when ``demo`` forces it, or when several local
    nodes would each claim the same GPUs."""
    demo_line = f"{gpus} demo GPU{'s' if gpus != 1 else ''} per node (made-up UUIDs)"
    if demo:
        return GpuChoice("static", gpus, f"GPUs: the demo inventory (--demo): {demo_line}")
    from gpusched.agent.nvml import NvmlUnavailable, discover

    try:
        found = discover()
    except NvmlUnavailable as exc:
        return GpuChoice("static", gpus, f"GPUs: none found ({exc.message}); using the demo "
                                         f"inventory: {demo_line}")
    whole = [g for g in found.gpus if g.parent is None]
    if not whole:
        return GpuChoice("static", gpus, "GPUs: NVML reports no GPU on this host; using the "
                                         f"demo inventory: {demo_line}")
    kinds: dict[str, int] = {}
    for gpu in whole:
        kinds[gpu.type] = kinds.get(gpu.type, 0) + 1
    what = ", ".join(f"{n} x {kind}" for kind, n in sorted(kinds.items()))
    driver = f", driver {found.driver}" if found.driver else ""
    if nodes > 1:
        return GpuChoice("static", gpus, f"GPUs: this host has {what} (NVML{driver}), but "
                                         f"{nodes} local nodes cannot share them; using the "
                                         f"demo inventory: {demo_line}")
    slices = len(found.gpus) - len(whole)
    return GpuChoice("nvml", len(whole), f"GPUs: {what} found through NVML{driver}"
                     + (f", {slices} MIG slices" if slices else "")
                     + "; the agent uses them (gpusched up --demo for made-up ones)")


def _gpus_table(choice: GpuChoice) -> str:
    if choice.source == "nvml":
        return 'source = "nvml"\n'
    return f'source = "static"\ncount = {choice.count}\n'


def _config_text(cluster: LocalCluster, database_url: str, gpus: GpuChoice, node: str,
                 state_dir: Path, network: _Network | None = None,
                 for_agent: bool = False) -> str:
    top = controller = auth = ""
    if network is not None:
        address = f"127.0.0.1:{network.port}"
        controller = f'listen = ["{address}"]\n'
        if for_agent:
            top = f'controllers = ["{address}"]\n'
            auth = (f'[auth]\nmethod = "key"\n'
                    f'host_key_file = "{network.node_keys / (node + ".key")}"\n')
        else:
            auth = f'[auth]\nmethod = "key"\nkey_file = "{network.master_key}"\n'
    return f"""# Generated by 'gpusched up'; edit etc/gpusched.toml-style keys here if you like.
{top}
[database]
url = "{database_url}"

[controller]
socket = "{cluster.socket}"
schedule_interval = 5.0
{controller}
[agent]
node_name = "{node}"
state_dir = "{state_dir}"
poll_wait = 20.0
kill_grace = 10.0
{_root_jobs_line()}
[agent.gpus]
{_gpus_table(gpus)}
{auth}
[[partitions]]
name = "gpu"
default = true
"""


def _write_private(path: Path, text: str) -> None:
    with os.fdopen(_private_fd(path, os.O_TRUNC), "w") as f:
        f.write(text)


def _configured_port(cluster: LocalCluster) -> int | None:
    """The TCP port in the controller's configuration, if it listens on one."""
    try:
        with open(cluster.config_file, "rb") as f:
            listen = tomllib.load(f).get("controller", {}).get("listen") or []
        return int(str(listen[0]).rsplit(":", 1)[1]) if listen else None
    except (OSError, tomllib.TOMLDecodeError, ValueError, IndexError):
        return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _network(cluster: LocalCluster, names: list[str], keep_port: bool) -> _Network:
    """The keys (made once: a master key, and one per node derived from it) and the
    port of a several-node cluster; the port stays while the controller runs on it."""
    from gpusched.auth.keys import (
        derive_host_key,
        new_master_key,
        read_master_key,
        render_host_key,
        render_master_key,
        write_key_file,
    )

    keys = cluster.state_dir / "auth"
    keys.mkdir(mode=0o700, exist_ok=True)
    os.chmod(keys, 0o700)
    master_path = keys / "master.key"
    if not master_path.exists():
        write_key_file(master_path, render_master_key(new_master_key()))
    master = read_master_key(master_path)
    for name in names:
        node_key = keys / f"{name}.key"
        if not node_key.exists():
            write_key_file(node_key, render_host_key(derive_host_key(master, name)))
    port = _configured_port(cluster) if keep_port else None
    return _Network(port or _free_port(), master_path, keys)


def _write_config(cluster: LocalCluster, database_url: str, gpus: GpuChoice, nodes: int,
                  keep_port: bool = False) -> None:
    """The controller's configuration (with the agent of a one-node cluster), and one
    file per agent when there are several: those reach the controller over TCP with
    credentials, each its own node's, as agents on other hosts would."""
    names = node_names(nodes)
    network = _network(cluster, names, keep_port) if nodes > 1 else None
    _write_private(cluster.config_file, _config_text(
        cluster, database_url, gpus, names[0], cluster.state_dir / "agent", network))
    if network is None:
        return
    (cluster.state_dir / "agents").mkdir(mode=0o700, exist_ok=True)
    for name in names:
        _write_private(cluster.agent_config(name), _config_text(
            cluster, database_url, gpus, name, cluster.state_dir / "agents" / name, network,
            for_agent=True))


def _spawn(cluster: LocalCluster, daemon: str, config: Path | None = None,
           name: str | None = None) -> int:
    """Start ``daemon`` (controller or agent) with ``config``; its pid file and log are
    named ``name`` (default: the daemon's)."""
    name = name or daemon
    cluster.logs.mkdir(parents=True, exist_ok=True, mode=0o700)
    log = _private_fd(cluster.logs / f"{name}.log", os.O_APPEND)
    proc = subprocess.Popen(
        # -P and cwd="/": the caller's directory may hold something named "gpusched"
        # (the state directory itself, for one) that must not shadow the package.
        [sys.executable, "-P", "-m", "gpusched.cli.gpusched", daemon,
         "--config", str(config or cluster.config_file)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, cwd="/",
    )
    os.close(log)
    cluster.pidfile(name).write_text(str(proc.pid))
    return proc.pid


def _wait(what: str, check: Callable[[], bool], cluster: LocalCluster, daemon: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while not check():
        if cluster.pid(daemon) is None:
            tail = (cluster.logs / f"{daemon}.log").read_text(errors="replace")[-1500:]
            raise Unavailable(f"the {daemon} exited during start-up; its log ends:\n{tail}")
        if time.monotonic() > deadline:
            raise Unavailable(f"timed out waiting for {what}; see {cluster.logs / (daemon + '.log')}")
        time.sleep(0.05)


def _api(cluster: LocalCluster, path: str) -> dict | None:  # type: ignore[type-arg]
    from gpusched.client import ApiClient
    from gpusched.errors import GpuschedError

    try:
        with ApiClient(cluster.socket, timeout=5) as client:
            return client.request("GET", path)
    except GpuschedError:
        return None


def _nodes_up(cluster: LocalCluster, names: list[str],
              fresh: tuple[set[str], datetime] | None = None) -> bool:
    """Whether every node of ``names`` is UP; those of ``fresh`` (nodes, when their
    agents started) registered since then, not an earlier agent's inventory."""
    nodes = _api(cluster, "/v1/nodes")
    up_now = {n["name"] for n in nodes["nodes"] if n["state"] == "UP" and (
        fresh is None or n["name"] not in fresh[0]
        or (n["last_seen"] and datetime.fromisoformat(n["last_seen"]) >= fresh[1]))
    } if nodes else set()
    return up_now >= set(names)


def up(gpus: int, database_url: str | None, say: Callable[[str], None],
       nodes: int = 1, demo: bool = False) -> LocalCluster:
    """Start whatever part of the local cluster is not running; return when it is ready.

    ``nodes`` agents run, each a node of its own: with this host's GPUs (NVML) when it
    has some and ``demo`` is false, else with ``gpus`` demo GPUs (see choose_gpus)."""
    started: list[str] = []

    def report(line: str) -> None:
        started.append(line)
        say(line)

    cluster = _start_missing(gpus, database_url, report, nodes, demo)
    if not started:
        say("gpusched is already running")
    return cluster


def _agent_daemons(cluster: LocalCluster, names: list[str]) -> list[tuple[str, Path]]:
    """(pid/log name, config) of each agent of a cluster of ``names``."""
    if len(names) == 1:
        return [("agent", cluster.config_file)]
    return [(f"agent-{name}", cluster.agent_config(name)) for name in names]


def _start_missing(gpus: int, database_url: str | None, say: Callable[[str], None],
                   nodes: int = 1, demo: bool = False) -> LocalCluster:
    cluster = LocalCluster(local_state_dir())
    cluster.state_dir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chmod(cluster.state_dir, 0o755)  # the PostgreSQL user must reach pgdata
    database_url = database_url or os.environ.get("GPUSCHED_DATABASE_URL")
    if database_url is None:
        database_url = start_database(cluster, say)
        if (cluster.pid("controller") is not None
                and configured_database_url(cluster) not in (None, database_url)):
            # The database moved (to a private socket directory): the controller must
            # start again with the new URL. Jobs keep running under their supervisors.
            _terminate(cluster, "controller", say)
    from gpusched.db.migrate import upgrade

    upgrade(database_url)
    names = node_names(nodes)
    agents = _agent_daemons(cluster, names)
    if cluster.pid("controller") is None:
        choice = choose_gpus(demo, gpus, nodes)
        say(choice.line)
        _write_config(cluster, database_url, choice, nodes)
        _spawn(cluster, "controller")
        _wait("the controller", lambda: _api(cluster, "/v1/ping") is not None, cluster, "controller")
        port = _configured_port(cluster)
        say(f"started the controller (socket {cluster.socket}"
            + (f", TCP 127.0.0.1:{port} with key credentials)" if port else ")"))
    elif any(not config.exists() for _, config in agents):
        if nodes > 1 and _configured_port(cluster) is None:
            raise Unavailable("the local cluster runs with one node; 'gpusched down' first "
                              f"to start it again with {nodes}")
        choice = choose_gpus(demo, gpus, nodes)
        say(choice.line)
        _write_config(cluster, database_url, choice, nodes, keep_port=True)
    since, spawned = datetime.now(UTC), set()
    for (name, config), node in zip(agents, names):
        if cluster.pid(name) is None:
            _spawn(cluster, "agent", config, name)
            spawned.add(node)
            say(f"started the agent of {name.removeprefix('agent-')}" if nodes > 1
                else "started the agent")
    _wait("the agents to register", lambda: _nodes_up(cluster, names, (spawned, since)),
          cluster, agents[0][0])
    return cluster


def _terminate(cluster: LocalCluster, daemon: str, say: Callable[[str], None]) -> None:
    pid = cluster.pid(daemon)
    if pid is None:
        cluster.pidfile(daemon).unlink(missing_ok=True)
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while cluster.pid(daemon) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    if cluster.pid(daemon) is not None:
        os.kill(pid, signal.SIGKILL)
    cluster.pidfile(daemon).unlink(missing_ok=True)
    say(f"stopped the {daemon}")


def down(say: Callable[[str], None]) -> None:
    """Stop the agent, the controller and the embedded PostgreSQL.

    Running jobs are not killed: their supervisors keep them going, and the agent
    re-adopts them at the next ``gpusched up``.
    """
    cluster = LocalCluster(local_state_dir())
    for pidfile in sorted(cluster.state_dir.glob("agent*.pid")):
        _terminate(cluster, pidfile.stem, say)
    _terminate(cluster, "controller", say)
    if (cluster.state_dir / "pgdata").exists():
        pg = embedded_server(cluster)  # stopping needs only the data directory
        if pg.running():
            pg.stop()
            say("stopped PostgreSQL")
