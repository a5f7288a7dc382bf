"""Typed configuration, validated once at load into frozen objects.

An error names the file, the key and what was expected. The example
``etc/gpusched.toml`` documents every key.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpusched.agent.settings import CGROUP_MODES as CGROUP_MODES  # re-exported
from gpusched.agent.settings import GPU_SOURCES as GPU_SOURCES
from gpusched.agent.settings import AgentConfig as AgentConfig
from gpusched.agent.settings import StaticGpu as StaticGpu
from gpusched.agent.settings import demo_gpus as demo_gpus
from gpusched.agent.settings import parse_agent
from gpusched.auth.settings import AuthConfig, parse_auth
from gpusched.client.endpoints import Endpoint, endpoints_in, parse_endpoint
from gpusched.configfile import TableReader as TableReader  # re-exported
from gpusched.configfile import read_toml as read_toml
from gpusched.core.model import PACKINGS, Policy
from gpusched.core.priority import PriorityWeights
from gpusched.errors import ConfigError
from gpusched.mailconfig import MailConfig, parse_mail

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
_GROUP = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")


@dataclass(frozen=True)
class PartitionConfig:
    """A partition as configured: ``nodes = ["*"]`` means every node."""

    name: str
    nodes: tuple[str, ...] = ("*",)
    default: bool = False
    max_time: int | None = None
    default_time: int | None = None


@dataclass(frozen=True)
class RetentionConfig:
    """Purging finished jobs (Slurm's PurgeJobAfter, ArchiveJobs, ArchiveDir): those that
    ended more than ``purge_after`` seconds ago are written to compressed files in
    ``archive_dir`` (unless ``archive`` is false) and deleted, every ``interval``
    seconds, at most ``batch_size`` jobs a transaction (docs/admin-guide.md). None: kept."""

    purge_after: int | None = None
    archive: bool = True
    archive_dir: Path = Path("/var/lib/gpusched/archive")
    interval: float = 3600.0
    batch_size: int = 1000


RETENTION_BOUNDS = {"purge_job_after": (3600, 36_500 * 86_400), "interval": (1, 86_400),
                    "batch_size": (1, 10_000)}


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
    retention: RetentionConfig = field(default_factory=RetentionConfig)


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
    # Seconds a pass may use the admin tables as read before, with no change heard.
    admin_cache_max_age: float = 60.0
    # Seconds an allocation's client (galloc, gsrun outside a job) may be silent before
    # the allocation ends CANCELLED ("client lost").
    allocation_grace: float = 60.0
    # How a share of one GPU is placed ("bestfit" or "fgd", core/sharing.py), and
    # whether jobs of different users may share one GPU by MPS.
    packing: str = "bestfit"
    mps_multi_user: bool = False

    def policy(self) -> Policy:
        """The core Policy these settings describe."""
        return Policy(weights=self.weights, fairshare=self.fairshare, backfill=self.backfill,
                      reservations=self.reservations, backfill_max_jobs=self.backfill_max_jobs,
                      preempt_mode=self.preempt_mode, preempt_grace=self.preempt_grace,
                      packing=self.packing, mps_multi_user=self.mps_multi_user)


@dataclass(frozen=True)
class MetricsConfig:
    """Where the controller and the agent serve ``GET /metrics`` (docs/operations.md);
    None: not served."""

    controller_listen: Endpoint | None = None
    agent_listen: Endpoint | None = None


def _metrics(r: TableReader) -> MetricsConfig:
    r.check_keys({"controller_listen", "agent_listen"})
    found: dict[str, Endpoint | None] = {}
    for key in ("controller_listen", "agent_listen"):
        value = r.get(key, str, None, "'host:port' such as '127.0.0.1:9464'")
        if value is not None and not value.rpartition(":")[2].isdigit():
            raise r.fail(key, "'host:port' such as '127.0.0.1:9464' (the port is required)")
        try:
            found[key] = None if value is None else parse_endpoint(value)
        except ValueError as exc:
            raise ConfigError(f"{r.source}: {r.prefix}{key}: {exc}") from None
    return MetricsConfig(**found)


@dataclass(frozen=True)
class Config:
    """The whole configuration of a gpusched installation."""

    database_url: str = "postgresql+psycopg://gpusched@/gpusched?host=/run/postgresql"
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    partitions: tuple[PartitionConfig, ...] = (PartitionConfig("gpu", default=True),)
    auth: AuthConfig = field(default_factory=AuthConfig)
    mail: MailConfig = field(default_factory=MailConfig)  # mail about jobs
    # Where CLIs and agents reach the controllers over TCP, tried in turn; empty: the
    # local Unix socket ([controller] socket).
    controllers: tuple[Endpoint, ...] = ()
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    cluster_name: str = "gpusched"  # Slurm's ClusterName: what gsubmit -M accepts
    source: str = "<defaults>"

    def default_partition(self) -> PartitionConfig:
        """The partition jobs go to when they name none."""
        for part in self.partitions:
            if part.default:
                return part
        return self.partitions[0]


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
                  "listen", "node_addresses", "retention"})
    mode = r.get("socket_mode", int, 0o666, "an integer file mode such as 0o666")
    if not 0 <= mode <= 0o777:
        raise r.fail("socket_mode", "an integer file mode such as 0o666")
    return ControllerConfig(
        socket=r.absolute_path("socket", ControllerConfig.socket),
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
        retention=_retention(r.sub("retention")),
    )


def _retention(r: TableReader) -> RetentionConfig:
    r.check_keys({"purge_job_after", "archive_jobs", "archive_dir", "interval", "batch_size"})
    low, high = RETENTION_BOUNDS["purge_job_after"]
    expected = "a time from 1:00:00 to 36500-00:00:00 such as '30-00:00:00', or 'UNLIMITED'"
    after = r.time_limit("purge_job_after") if "purge_job_after" in r.table else None
    if after is not None and not low <= after <= high:
        raise r.fail("purge_job_after", expected)
    low, high = RETENTION_BOUNDS["interval"]
    interval = r.get("interval", float, RetentionConfig.interval, "1 to 86400 seconds")
    if not low <= interval <= high:  # NaN fails too
        raise r.fail("interval", "1 to 86400 seconds")
    low, high = RETENTION_BOUNDS["batch_size"]
    batch = r.get("batch_size", int, RetentionConfig.batch_size, "1 to 10000 jobs")
    if not low <= batch <= high:
        raise r.fail("batch_size", "1 to 10000 jobs")
    archive_dir = r.absolute_path("archive_dir", RetentionConfig.archive_dir)
    if "\0" in str(archive_dir) or len(str(archive_dir)) > 1024:
        raise r.fail("archive_dir", "an absolute path (at most 1024 characters, no NUL)")
    return RetentionConfig(
        purge_after=after, archive=r.get("archive_jobs", bool, True, "true or false"),
        archive_dir=archive_dir,
        interval=float(interval), batch_size=int(batch))


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
                  "pass_budget", "admin_cache_max_age", "allocation_grace", "packing",
                  "mps_multi_user"})
    defaults = SchedulerConfig()
    packing = r.get("packing", str, defaults.packing, "'bestfit' or 'fgd'")
    if packing not in PACKINGS:
        raise r.fail("packing", "'bestfit' or 'fgd'")
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
        admin_cache_max_age=_admin_cache_max_age(r, defaults.admin_cache_max_age),
        allocation_grace=_allocation_grace(r, defaults.allocation_grace),
        packing=packing,
        mps_multi_user=r.get("mps_multi_user", bool, defaults.mps_multi_user, "true or false"),
    )


def _allocation_grace(r: TableReader, default: float) -> float:
    expected = "5 to 86400 seconds"
    value = r.get("allocation_grace", float, default, expected)
    if not 5 <= value <= 86_400:  # NaN fails too
        raise r.fail("allocation_grace", expected)
    return float(value)


def _admin_cache_max_age(r: TableReader, default: float) -> float:
    expected = "0 to 3600 seconds"
    value = r.get("admin_cache_max_age", float, default, expected)
    if not 0 <= value <= 3600:  # NaN fails too
        raise r.fail("admin_cache_max_age", expected)
    return float(value)


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
                    "controllers", "metrics", "mail", "cluster_name"})
    database = top.sub("database")
    database.check_keys({"url"})
    url = database.get("url", str, Config.database_url, "a SQLAlchemy URL 'postgresql+psycopg://…'")
    if not url.startswith("postgresql"):
        raise database.fail("url", "a SQLAlchemy URL 'postgresql+psycopg://…'")
    controller, agent = _controller(top.sub("controller")), parse_agent(top.sub("agent"))
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
        mail=parse_mail(top.sub("mail")),
        controllers=controllers,
        metrics=_metrics(top.sub("metrics")),
        cluster_name=top.get("cluster_name", str, Config.cluster_name, "a cluster name"),
        source=source,
    )


def load_config(path: Path | None) -> Config:
    """Load and validate a config file; ``None`` gives the built-in defaults."""
    if path is None:
        return Config()
    return parse_config(read_toml(path), str(path))
