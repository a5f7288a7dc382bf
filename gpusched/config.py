"""Typed configuration, validated once at load into frozen objects.

An error names the file, the key and what was expected. The example
``etc/gpusched.toml`` documents every key.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpusched.auth.settings import AuthConfig, parse_auth
from gpusched.client.endpoints import Endpoint, endpoints_in
from gpusched.configfile import TableReader as TableReader  # re-exported
from gpusched.configfile import read_toml as read_toml
from gpusched.core.model import Policy
from gpusched.core.priority import PriorityWeights
from gpusched.core.shapes import is_gpu_kind, is_mig_profile
from gpusched.core.topology import LINK_KINDS
from gpusched.errors import ConfigError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HEX_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
# GPU-<uuid>, MIG-<uuid>, and the older MIG-GPU-<uuid>/<gi>/<ci> form of MIG devices.
_GPU_UUID = re.compile(rf"^(GPU-{_HEX_UUID}|MIG-{_HEX_UUID}|MIG-GPU-{_HEX_UUID}/\d+/\d+)$")
_GROUP = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_DEMO_NAMESPACE = uuid.UUID("6c4d1f0e-2b7a-4f4e-9a53-0f6d5b2c9e11")


GPU_SOURCES = ("auto", "nvml", "static")
CGROUP_MODES = ("auto", "required", "off")


@dataclass(frozen=True)
class StaticGpu:
    """One GPU of a static inventory."""

    index: int
    uuid: str
    name: str = "Demo GPU"
    memory_mb: int = 0
    pci_bus_id: str = ""
    type: str = "gpu"  # normalised GPU type requests name (a100-80gb, h100-80gb, l4)
    mig_profile: str | None = None  # a MIG slice: its profile (1g.10gb) ...
    parent: int | None = None  # ... and the index of the GPU it is cut from
    # The device minor (/dev/nvidiaN; a slice: None, its parent's is used), the NUMA node
    # nearest the GPU (None: unknown), and a slice's GPU and compute instance ids.
    minor: int | None = None
    numa_node: int | None = None
    gi_id: int | None = None
    ci_id: int | None = None


@dataclass(frozen=True)
class PartitionConfig:
    """A partition as configured: ``nodes = ["*"]`` means every node."""

    name: str
    nodes: tuple[str, ...] = ("*",)
    default: bool = False
    max_time: int | None = None
    default_time: int | None = None


@dataclass(frozen=True)
class ControllerConfig:
    """Settings of ``gpusched controller``."""

    socket: Path = Path("/run/gpusched/controller.sock")
    socket_mode: int = 0o666
    schedule_interval: float = 5.0
    node_timeout: float = 60.0
    gpu_resume_after: float = 0.0  # seconds a failed GPU stays out before it returns; 0: never
    # A running job whose GPUs are at most idle_percent busy for idle_after seconds is
    # flagged idle (shown, not acted on).
    idle_percent: float = 1.0
    idle_after: float = 3600.0
    # Jobs one user may have pending or running at once (each array task counts), unless
    # an association or QOS sets its own; administrators are not held to it. None: none.
    max_submit_jobs_per_user: int | None = 10_000
    # The API server: seconds a client may take to send a whole request (and to read an
    # answer); open connections of ordinary users in all, and of any one of them. Root's
    # and the controller's own user's connections (agents, administrators) are not capped.
    idle_timeout: float = 30.0
    max_connections: int = 256
    max_connections_per_user: int = 32
    # Members of this group (and root) are administrators, as proved by their credential.
    admin_group: str | None = None
    # TCP addresses the API is also served on (every request there must carry a
    # credential, [auth]); empty: the Unix socket only.
    listen: tuple[Endpoint, ...] = ()
    # The addresses a node's munge credentials may come from, where DNS does not give
    # them: (node name, (address, ...)) pairs.
    node_addresses: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class AgentConfig:
    """Settings of ``gpusched agent``."""

    node_name: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    state_dir: Path = Path("/var/lib/gpusched/agent")
    poll_wait: float = 20.0
    kill_grace: float = 30.0
    # "nvml": discover GPUs through NVML; "static": the inventory below; "auto": NVML when
    # its library loads, else the static inventory.
    gpu_source: str = "auto"
    static_gpus: tuple[StaticGpu, ...] = ()
    # (index, index, kind, nvlinks): how two GPUs of the static inventory are connected.
    static_links: tuple[tuple[int, int, str, int], ...] = ()
    block: str | None = None  # topology block (switch, rack) multi-node jobs keep within
    rediscover_interval: float = 60.0  # seconds between checks that the GPUs are unchanged
    # The GPU health loop (NVML only): Xids that are a job's own fault, the temperature
    # (Celsius) over which a GPU leaves service, and seconds between checks.
    ignore_xids: tuple[int, ...] = (13, 31, 43, 45, 68, 109)
    max_temperature: float = 90.0
    health_interval: float = 10.0
    # Jobs of a uid below this are refused (0 lets root's jobs run).
    min_job_uid: int = 1
    # Whom the agent trusts to serve the controller's socket besides root and itself:
    # a user name or uid, or None.
    controller_user: str | None = None
    # Confinement of jobs in cgroups: "auto" (where a cgroup can be made; said once at
    # start otherwise), "required" (the agent does not start without) or "off"; the
    # directory the agent owns (None: found at start); whether jobs may swap.
    cgroups: str = "auto"
    cgroup_root: Path | None = None
    allow_swap: bool = False
    # Site programs run as root on this node with the job's variables: before each job
    # (a failure requeues it and drains the node) and after (a failure drains the
    # node), each within its timeout (seconds).
    prolog: Path | None = None
    epilog: Path | None = None
    prolog_timeout: float = 60.0
    epilog_timeout: float = 60.0
    # The node health check: run every health_check_interval seconds and before the
    # node takes work; a failure drains the node with its first line of output, and a
    # pass lifts a drain an earlier failure made.
    health_check: Path | None = None
    health_check_interval: float = 300.0
    health_check_timeout: float = 60.0


@dataclass(frozen=True)
class SchedulerConfig:
    """Priority weights and fair-share settings of the scheduling passes."""

    weights: PriorityWeights = field(default_factory=lambda: PriorityWeights(job_size=0.0))
    fairshare: str = "fair_tree"
    half_life: float = 7 * 86400.0
    usage_interval: float = 30.0
    backfill: str = "easy"
    reservations: int | None = None
    backfill_max_jobs: int | None = 5000
    preempt_mode: str = "requeue"
    preempt_grace: float = 30.0
    pass_budget: float = 2.0  # seconds a pass may plan for; 0: no limit

    def policy(self) -> Policy:
        """The core Policy these settings describe."""
        return Policy(weights=self.weights, fairshare=self.fairshare, backfill=self.backfill,
                      reservations=self.reservations, backfill_max_jobs=self.backfill_max_jobs,
                      preempt_mode=self.preempt_mode, preempt_grace=self.preempt_grace)


@dataclass(frozen=True)
class Config:
    """The whole configuration of a gpusched installation."""

    database_url: str = "postgresql+psycopg://gpusched@/gpusched?host=/run/postgresql"
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    partitions: tuple[PartitionConfig, ...] = (PartitionConfig("gpu", default=True),)
    auth: AuthConfig = field(default_factory=AuthConfig)
    # Where CLIs and agents reach the controllers over TCP, tried in turn; empty: the
    # local Unix socket ([controller] socket).
    controllers: tuple[Endpoint, ...] = ()
    source: str = "<defaults>"

    def default_partition(self) -> PartitionConfig:
        """The partition jobs go to when they name none."""
        for part in self.partitions:
            if part.default:
                return part
        return self.partitions[0]


def demo_gpus(node_name: str, count: int) -> tuple[StaticGpu, ...]:
    """A demo inventory of ``count`` GPUs with UUIDs stable for this node name."""
    return tuple(
        StaticGpu(
            index=i,
            uuid=f"GPU-{uuid.uuid5(_DEMO_NAMESPACE, f'{node_name}/{i}')}",
            name="gpusched demo GPU",
            memory_mb=81920,
            pci_bus_id=f"00000000:{0x10 + i % 0xE0:02X}:{i // 0xE0:02X}.0",
            minor=i if i < 255 else None,
        )
        for i in range(count)
    )


def _path(r: TableReader, key: str, default: Path) -> Path:
    value = r.get(key, str, str(default), "an absolute path")
    if not value.startswith("/"):
        raise r.fail(key, "an absolute path")
    return Path(value)


def _submit_limit(r: TableReader) -> int | None:
    expected = "a number of jobs (1 or more; 0 for no limit)"
    value = r.get("max_submit_jobs_per_user", int, ControllerConfig.max_submit_jobs_per_user,
                  expected)
    if value is not None and value < 0:
        raise r.fail("max_submit_jobs_per_user", expected)
    return value or None


def _controller(r: TableReader) -> ControllerConfig:
    r.check_keys({"socket", "socket_mode", "schedule_interval", "node_timeout",
                  "gpu_resume_after", "idle_percent", "idle_after", "max_submit_jobs_per_user",
                  "idle_timeout", "max_connections", "max_connections_per_user", "admin_group",
                  "listen", "node_addresses"})
    mode = r.get("socket_mode", int, 0o666, "an integer file mode such as 0o666")
    if not 0 <= mode <= 0o777:
        raise r.fail("socket_mode", "an integer file mode such as 0o666")
    return ControllerConfig(
        socket=_path(r, "socket", ControllerConfig.socket),
        socket_mode=mode,
        schedule_interval=r.positive("schedule_interval", ControllerConfig.schedule_interval),
        node_timeout=r.positive("node_timeout", ControllerConfig.node_timeout),
        gpu_resume_after=r.positive("gpu_resume_after", ControllerConfig.gpu_resume_after,
                                    allow_zero=True),
        idle_percent=r.positive("idle_percent", ControllerConfig.idle_percent, allow_zero=True),
        idle_after=r.positive("idle_after", ControllerConfig.idle_after),
        max_submit_jobs_per_user=_submit_limit(r),
        idle_timeout=r.positive("idle_timeout", ControllerConfig.idle_timeout),
        max_connections=_connection_cap(r, "max_connections", ControllerConfig.max_connections),
        max_connections_per_user=_connection_cap(r, "max_connections_per_user",
                                                 ControllerConfig.max_connections_per_user),
        admin_group=_group_name(r, "admin_group"),
        listen=endpoints_in(r, "listen"),
        node_addresses=_node_addresses(r.sub("node_addresses")),
    )


def _node_addresses(r: TableReader) -> tuple[tuple[str, tuple[str, ...]], ...]:
    expected = "a list of 1 to 16 IP addresses, such as [\"10.0.0.5\"]"
    pairs = []
    for name, values in r.table.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(f"{r.source}: {r.prefix}{name!r:.80}: expected a node name "
                              "(letters, digits, '_', '.', '-')")
        if not isinstance(values, list) or not 1 <= len(values) <= 16:
            raise r.fail(name, expected)
        try:
            addresses = tuple(str(ipaddress.ip_address(v)) for v in values)
        except ValueError:
            raise r.fail(name, expected) from None
        pairs.append((name, addresses))
    return tuple(pairs)


def _group_name(r: TableReader, key: str) -> str | None:
    expected = "a group name (letters, digits, '_', '.', '-'; at most 64)"
    value = r.get(key, str, None, expected)
    if value is not None and not _GROUP.match(value):
        raise r.fail(key, expected)
    return None if value is None else str(value)


def _connection_cap(r: TableReader, key: str, default: int) -> int:
    value = r.get(key, int, default, "a number of connections from 1 to 100000")
    if not 1 <= value <= 100_000:
        raise r.fail(key, "a number of connections from 1 to 100000")
    return int(value)


def _scheduler(r: TableReader) -> SchedulerConfig:
    r.check_keys({"fairshare", "half_life", "usage_interval", "weights", "backfill",
                  "reservations", "backfill_max_jobs", "preempt_mode", "preempt_grace",
                  "pass_budget"})
    defaults = SchedulerConfig()
    preempt_mode = r.get("preempt_mode", str, defaults.preempt_mode,
                         "'requeue', 'cancel' or 'off'")
    if preempt_mode not in ("requeue", "cancel", "off"):
        raise r.fail("preempt_mode", "'requeue', 'cancel' or 'off'")
    backfill = r.get("backfill", str, defaults.backfill, "'none', 'easy' or 'conservative'")
    if backfill not in ("none", "easy", "conservative"):
        raise r.fail("backfill", "'none', 'easy' or 'conservative'")
    reservations = r.get("reservations", int, None, "a number of jobs (0 or more)")
    if reservations is not None and reservations < 0:
        raise r.fail("reservations", "a number of jobs (0 or more)")
    max_jobs = r.get("backfill_max_jobs", int, defaults.backfill_max_jobs,
                     "a number of jobs (1 or more; 0 for no limit)")
    if max_jobs is not None and max_jobs < 0:
        raise r.fail("backfill_max_jobs", "a number of jobs (1 or more; 0 for no limit)")
    fairshare = r.get("fairshare", str, defaults.fairshare, "'fair_tree' or 'classic'")
    if fairshare not in ("fair_tree", "classic"):
        raise r.fail("fairshare", "'fair_tree' or 'classic'")
    half_life = r.time_limit("half_life") if "half_life" in r.table else defaults.half_life
    w = r.sub("weights")
    w.check_keys({"age", "fairshare", "job_size", "partition", "qos", "max_age", "favor_small"})
    d = defaults.weights
    max_age = w.time_limit("max_age") if "max_age" in w.table else d.max_age
    weights = PriorityWeights(
        age=w.positive("age", d.age, allow_zero=True),
        fairshare=w.positive("fairshare", d.fairshare, allow_zero=True),
        job_size=w.positive("job_size", d.job_size, allow_zero=True),
        partition=w.positive("partition", d.partition, allow_zero=True),
        qos=w.positive("qos", d.qos, allow_zero=True),
        max_age=float(max_age) if max_age else d.max_age,
        favor_small=w.get("favor_small", bool, d.favor_small, "true or false"),
    )
    return SchedulerConfig(
        weights=weights, fairshare=fairshare,
        half_life=float(half_life) if half_life else 0.0,
        usage_interval=r.positive("usage_interval", defaults.usage_interval),
        backfill=backfill, reservations=reservations, backfill_max_jobs=max_jobs or None,
        preempt_mode=preempt_mode,
        preempt_grace=r.positive("preempt_grace", defaults.preempt_grace, allow_zero=True),
        pass_budget=r.positive("pass_budget", defaults.pass_budget, allow_zero=True),
    )


def _static_gpus(r: TableReader, node_name: str) -> tuple[StaticGpu, ...]:
    count = r.get("count", int, None, "a number of demo GPUs (0 or more)")
    listed = r.table.get("static", [])
    if not isinstance(listed, list):
        raise r.fail("static", "an array of tables [[agent.gpus.static]]")
    if count is not None:
        if count < 0:
            raise r.fail("count", "a number of demo GPUs (0 or more)")
        if listed:
            raise ConfigError(f"{r.source}: {r.prefix}count and {r.prefix}static: give one, not both")
        return demo_gpus(node_name, count)
    gpus: list[StaticGpu] = []
    for i, entry in enumerate(listed):
        if not isinstance(entry, dict):
            raise r.fail("static", "an array of tables [[agent.gpus.static]]")
        g = TableReader(r.source, entry, f"{r.prefix}static[{i}].")
        g.check_keys({"index", "uuid", "name", "memory_mb", "pci_bus_id", "type", "mig_profile",
                      "parent", "minor", "numa_node", "gi_id", "ci_id"})
        profile = g.get("mig_profile", str, None, "a MIG profile such as 1g.10gb")
        parent = g.get("parent", int, None, "the index of the GPU the slice is cut from")
        if (profile is None) != (parent is None):
            raise g.fail("parent" if parent is None else "mig_profile",
                         "both mig_profile and parent for a MIG slice, or neither")
        if profile is not None and not is_mig_profile(profile):
            raise g.fail("mig_profile", "a MIG profile such as 1g.10gb or 3g.40gb")
        gpu_type = g.get("type", str, "gpu", "a GPU type such as a100-80gb or l4")
        if not is_gpu_kind(gpu_type):
            raise g.fail("type", "a GPU type such as a100-80gb or l4 (lower case)")
        index = g.get("index", int, i, "a GPU index (0 or more)")
        expected = "a GPU UUID such as 'GPU-8c3f…' (GPU- or MIG- and a UUID)"
        gpu_uuid = g.get("uuid", str, None, expected)
        if gpu_uuid is None or not _GPU_UUID.match(gpu_uuid):
            raise g.fail("uuid", expected)
        if index < 0:
            raise g.fail("index", "a GPU index (0 or more)")
        if g.get("memory_mb", int, 0, "memory in MiB (0 or more)") < 0:
            raise g.fail("memory_mb", "memory in MiB (0 or more)")
        gpus.append(StaticGpu(
            index=index, uuid=gpu_uuid,
            name=g.get("name", str, "GPU", "a product name"),
            memory_mb=g.get("memory_mb", int, 0, "memory in MiB"),
            pci_bus_id=g.get("pci_bus_id", str, "", "a PCI bus id"),
            type=gpu_type, mig_profile=profile, parent=parent,
            **_static_device_ids(g, index, parent is not None),
        ))
    if len({g.uuid for g in gpus}) != len(gpus) or len({g.index for g in gpus}) != len(gpus):
        raise r.fail("static", "GPUs with distinct indexes and UUIDs")
    whole = {g.index for g in gpus if g.parent is None}
    if any(g.parent is not None and g.parent not in whole for g in gpus):
        raise r.fail("static", "MIG slices whose parent is the index of a whole GPU listed here")
    return tuple(gpus)




def _static_device_ids(g: TableReader, index: int, is_slice: bool) -> dict[str, int | None]:
    """minor and numa_node of a static GPU (minor defaults to its index), and a slice's
    gi_id and ci_id; each bounded as the kernel and NVML bound them."""
    found: dict[str, int | None] = {}
    for key, upper, default, expected in (
            ("minor", 254, None if is_slice or index > 254 else index,
             "the device minor number, /dev/nvidiaN (0 to 254)"),
            ("numa_node", 1023, None, "a NUMA node number (0 to 1023)"),
            ("gi_id", 255, None, "a MIG GPU instance id (0 to 255)"),
            ("ci_id", 255, None, "a MIG compute instance id (0 to 255)")):
        value = g.get(key, int, default, expected)
        if value is not None and not 0 <= value <= upper:
            raise g.fail(key, expected)
        found[key] = value
    if is_slice and found["minor"] is not None:
        raise g.fail("minor", "no minor for a MIG slice (its parent's is used)")
    if not is_slice and (found["gi_id"] is not None or found["ci_id"] is not None):
        raise g.fail("gi_id" if found["gi_id"] is not None else "ci_id",
                     "gi_id and ci_id only for a MIG slice")
    return found


def _static_links(r: TableReader) -> tuple[tuple[int, int, str, int], ...]:
    listed = r.table.get("links", [])
    if not isinstance(listed, list):
        raise r.fail("links", "an array of tables [[agent.gpus.links]]")
    links = []
    for i, entry in enumerate(listed):
        if not isinstance(entry, dict):
            raise r.fail("links", "an array of tables [[agent.gpus.links]]")
        g = TableReader(r.source, entry, f"{r.prefix}links[{i}].")
        g.check_keys({"gpus", "kind", "nvlinks"})
        pair = g.get("gpus", list, None, "two GPU indexes, such as [0, 1]")
        if (pair is None or len(pair) != 2 or not all(isinstance(x, int) for x in pair)
                or pair[0] == pair[1]):
            raise g.fail("gpus", "two different GPU indexes, such as [0, 1]")
        kind = g.get("kind", str, "NVLINK", f"one of {', '.join(LINK_KINDS)}")
        if kind not in LINK_KINDS:
            raise g.fail("kind", f"one of {', '.join(LINK_KINDS)}")
        links.append((min(pair), max(pair), kind, g.get("nvlinks", int, 0, "a number of links")))
    return tuple(links)


def _agent(r: TableReader) -> AgentConfig:
    r.check_keys({"node_name", "state_dir", "poll_wait", "kill_grace", "gpus", "block", "health",
                  "min_job_uid", "controller_user", "cgroups", "prolog", "epilog",
                  "health_check"})
    defaults = AgentConfig()
    min_job_uid = r.get("min_job_uid", int, defaults.min_job_uid, "a uid from 0 to 4294967294")
    if isinstance(min_job_uid, bool) or not 0 <= min_job_uid <= 4294967294:
        raise r.fail("min_job_uid", "a uid from 0 to 4294967294")
    controller_user = r.get("controller_user", (str, int), None, "a user name or uid")
    if isinstance(controller_user, bool) or (
            isinstance(controller_user, int) and not 0 <= controller_user <= 4294967294) or (
            isinstance(controller_user, str) and not 0 < len(controller_user) <= 64):
        raise r.fail("controller_user", "a user name or uid")
    node_name = r.name("node_name", defaults.node_name)
    gpus = r.sub("gpus")
    gpus.check_keys({"source", "count", "static", "links", "rediscover_interval"})
    source = gpus.get("source", str, "auto", "one of 'auto', 'nvml', 'static'")
    if source not in GPU_SOURCES:
        raise gpus.fail("source", "one of 'auto', 'nvml', 'static'")
    return AgentConfig(
        node_name=node_name,
        state_dir=_path(r, "state_dir", defaults.state_dir),
        poll_wait=r.positive("poll_wait", defaults.poll_wait),
        kill_grace=r.positive("kill_grace", defaults.kill_grace, allow_zero=True),
        gpu_source=source,
        static_gpus=_static_gpus(gpus, node_name),
        static_links=_static_links(gpus),
        block=r.get("block", str, None, "a topology block name"),
        min_job_uid=min_job_uid,
        controller_user=None if controller_user is None else str(controller_user),
        rediscover_interval=gpus.positive("rediscover_interval", defaults.rediscover_interval),
        **_health(r.sub("health"), defaults),
        **_cgroups(r.sub("cgroups"), defaults),
        **_site_programs(r, defaults),
    )


def _optional_path(r: TableReader, key: str) -> Path | None:
    value = r.get(key, str, None, "an absolute path")
    if value is None:
        return None
    if not value.startswith("/") or "\0" in value or len(value) > 4096:
        raise r.fail(key, "an absolute path")
    return Path(value)


def _cgroups(r: TableReader, defaults: AgentConfig) -> dict[str, Any]:
    r.check_keys({"enforce", "root", "allow_swap"})
    enforce = r.get("enforce", str, defaults.cgroups, "one of 'auto', 'required', 'off'")
    if enforce not in CGROUP_MODES:
        raise r.fail("enforce", "one of 'auto', 'required', 'off'")
    return {"cgroups": enforce, "cgroup_root": _optional_path(r, "root"),
            "allow_swap": r.get("allow_swap", bool, defaults.allow_swap, "true or false")}


def _site_programs(r: TableReader, defaults: AgentConfig) -> dict[str, Any]:
    """[agent.prolog], [agent.epilog], [agent.health_check]: program, timeout (and the
    health check's interval)."""
    found: dict[str, Any] = {}
    for key in ("prolog", "epilog", "health_check"):
        table = r.sub(key)
        table.check_keys({"program", "timeout", "interval"} if key == "health_check"
                         else {"program", "timeout"})
        found[key] = _optional_path(table, "program")
        found[f"{key}_timeout"] = table.positive("timeout", getattr(defaults, f"{key}_timeout"))
        if key == "health_check":
            found["health_check_interval"] = table.positive(
                "interval", defaults.health_check_interval)
    return found


def _health(r: TableReader, defaults: AgentConfig) -> dict[str, Any]:
    r.check_keys({"ignore_xids", "max_temperature", "interval"})
    xids = r.get("ignore_xids", list, list(defaults.ignore_xids), "a list of Xid numbers")
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in xids):
        raise r.fail("ignore_xids", "a list of Xid numbers")
    return {"ignore_xids": tuple(xids),
            "max_temperature": r.positive("max_temperature", defaults.max_temperature),
            "health_interval": r.positive("interval", defaults.health_interval)}


def _partitions(source: str, raw: Any) -> tuple[PartitionConfig, ...]:
    if raw is None:
        return Config.partitions
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{source}: partitions: expected one or more [[partitions]] tables")
    parts: list[PartitionConfig] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise ConfigError(f"{source}: partitions[{i}]: expected a table")
        r = TableReader(source, entry, f"partitions[{i}].")
        r.check_keys({"name", "nodes", "default", "max_time", "default_time"})
        nodes = r.get("nodes", list, ["*"], "a list of node names, or [\"*\"]")
        if not nodes or not all(isinstance(n, str) and (n == "*" or _NAME.match(n)) for n in nodes):
            raise r.fail("nodes", "a list of node names, or [\"*\"]")
        part = PartitionConfig(
            name=r.name("name"),
            nodes=tuple(nodes),
            default=r.get("default", bool, False, "true or false"),
            max_time=r.time_limit("max_time"),
            default_time=r.time_limit("default_time"),
        )
        if part.max_time is not None and "default_time" in entry:
            # An UNLIMITED default (None) under a finite maximum is above it too.
            if part.default_time is None or part.default_time > part.max_time:
                raise r.fail("default_time", "at most max_time")
        parts.append(part)
    names = [p.name for p in parts]
    if len(set(names)) != len(names):
        raise ConfigError(f"{source}: partitions: names must be distinct, got {names}")
    if sum(p.default for p in parts) > 1:
        raise ConfigError(f"{source}: partitions: at most one may have default = true")
    return tuple(parts)


def parse_config(data: Mapping[str, Any], source: str) -> Config:
    """Validate parsed TOML into a Config; raise ConfigError naming the bad key."""
    top = TableReader(source, data, "")
    top.check_keys({"database", "controller", "agent", "partitions", "scheduler", "auth",
                    "controllers"})
    database = top.sub("database")
    database.check_keys({"url"})
    url = database.get("url", str, Config.database_url, "a SQLAlchemy URL 'postgresql+psycopg://…'")
    if not url.startswith("postgresql"):
        raise database.fail("url", "a SQLAlchemy URL 'postgresql+psycopg://…'")
    controller, agent = _controller(top.sub("controller")), _agent(top.sub("agent"))
    if controller.node_timeout <= agent.poll_wait:
        raise ConfigError(f"{source}: controller.node_timeout: expected more than agent.poll_wait "
                          f"({agent.poll_wait:g} s), since the agent's poll is its heartbeat; "
                          f"got {controller.node_timeout:g}")
    auth, controllers = parse_auth(top.sub("auth")), endpoints_in(top, "controllers")
    for key, used in (("controller.listen", controller.listen), ("controllers", controllers)):
        if used and auth.method == "none":
            raise ConfigError(f"{source}: {key}: the API over TCP needs credentials: set [auth] "
                              "method to 'munge' or 'key' (an unauthenticated network API is "
                              "never served)")
    return Config(
        database_url=url,
        controller=controller,
        scheduler=_scheduler(top.sub("scheduler")),
        agent=agent,
        partitions=_partitions(source, data.get("partitions")),
        auth=auth,
        controllers=controllers,
        source=source,
    )


def load_config(path: Path | None) -> Config:
    """Load and validate a config file; ``None`` gives the built-in defaults."""
    if path is None:
        return Config()
    return parse_config(read_toml(path), str(path))
