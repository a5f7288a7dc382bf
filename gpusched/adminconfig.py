"""Admin configuration: partitions, accounts, users, QOS and GPU billing weights.

Read from ``partitions.toml`` / ``accounts.toml`` style files (see ``etc/``), validated
as a whole into frozen objects before anything is applied. A file may hold any of the
tables; together the files given to one ``gpusched admin apply`` describe the complete
desired state of each kind they mention.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpusched.adminpolicy import (
    IDLE_KEYS,
    budget_period,
    gpu_hours,
    idle_policy,
    license_counts,
    user_budgets,
)
from gpusched.config import TableReader, read_toml
from gpusched.core.hostlist import HostlistError, expand_hostlist
from gpusched.core.timefmt import TimeFormatError, parse_time_limit
from gpusched.errors import ConfigError, UsageError

PARTITION_STATES = ("UP", "DOWN", "DRAIN", "INACTIVE")
# How a partition's GPUs may be shared between jobs ("exclusive": not at all, stored as
# None), and the units each shared GPU offers unless ``shares`` says: MPS counts percent
# of the GPU, as Slurm's usual 100; shards are whole time slices, a few per GPU.
SHARING = ("exclusive", "mps", "shard")
DEFAULT_SHARES = {"mps": 100, "shard": 4}
MAX_SHARES = 10_000
ROOT_ACCOUNT = "root"
# Dynamic MIG: the least time between two layout changes of one GPU (seconds).
DEFAULT_MIG_INTERVAL = 600
MIN_MIG_INTERVAL, MAX_MIG_INTERVAL = 60, 7 * 86_400
_GPU_TYPE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}\Z")


@dataclass(frozen=True)
class PartitionSpec:
    """A partition as an admin declares it. ``nodes == ("*",)`` means every node."""

    name: str
    nodes: tuple[str, ...] = ("*",)
    default: bool = False
    max_time: int | None = None
    default_time: int | None = None
    priority_tier: int = 0
    allow_accounts: tuple[str, ...] | None = None  # None: every account
    deny_accounts: tuple[str, ...] = ()
    max_gpus_per_job: int | None = None
    state: str = "UP"
    requeue: bool = True  # jobs go back to the queue when their GPU fails, unless they say no
    sharing: str | None = None  # "mps" or "shard": jobs may ask for a share of one GPU
    shares: int | None = None  # units each GPU offers when shared (None when not)
    dynamic_mig: bool = False  # the scheduler may re-partition its nodes' idle MIG GPUs
    mig_min_interval: int = DEFAULT_MIG_INTERVAL  # seconds between two changes of one GPU
    # The idle-GPU policy (gpusched.core.idle_policy); all None: none.
    idle_warn_after: int | None = None
    idle_action: str | None = None
    idle_action_after: int | None = None


@dataclass(frozen=True)
class AccountSpec:
    """A node of the account tree."""

    name: str
    parent: str
    shares: int = 1
    qos: tuple[str, ...] | None = None  # the QOS its users may use; None: its parent's
    default_qos: str | None = None
    # Its GPU-hour budget (its sub-accounts' jobs count too; None: none) and its period.
    gpu_hours: float | None = None
    gpu_hours_period: str = "none"


@dataclass(frozen=True)
class UserSpec:
    """A user, the accounts they may charge, and their default one."""

    name: str
    accounts: tuple[str, ...]
    default_account: str
    shares: int = 1
    qos: tuple[str, ...] | None = None  # the QOS they may use; None: their account's
    default_qos: str | None = None
    max_submit_jobs: int | None = None  # jobs pending or running at once, per association
    # GPU-hour budgets, as (account, GPU-hours) of the accounts that have one, and their
    # period.
    gpu_hours: tuple[tuple[str, float], ...] = ()
    gpu_hours_period: str = "none"


@dataclass(frozen=True)
class QosSpec:
    """A quality of service: priority, per-user and per-account limits, preemption."""

    name: str
    priority: int = 0
    max_gpus_per_user: int | None = None
    max_jobs_per_user: int | None = None
    grp_gpus: int | None = None  # GPUs all jobs of one account may hold at once
    max_wall: int | None = None
    preempt: tuple[str, ...] = ()
    max_submit_jobs_per_user: int | None = None  # jobs of one user pending or running
    # The idle-GPU policy; wins over the partition's when set (gpusched.core.idle_policy).
    idle_warn_after: int | None = None
    idle_action: str | None = None
    idle_action_after: int | None = None


@dataclass(frozen=True)
class AdminConfig:
    """The desired state; a kind that no file mentions is None and left as it is."""

    partitions: tuple[PartitionSpec, ...] | None = None
    accounts: tuple[AccountSpec, ...] | None = None
    users: tuple[UserSpec, ...] | None = None
    qos: tuple[QosSpec, ...] | None = None
    billing: dict[str, float] | None = None
    licenses: dict[str, int] | None = None  # [licenses]: cluster-wide counts (sbatch's -L)
    nodes: tuple[NodeSpec, ...] | None = None  # [[node]]: features by node (-C)
    sources: tuple[str, ...] = field(default_factory=tuple)


def _names(r: TableReader, key: str, default: Any = None) -> tuple[str, ...] | None:
    value = r.get(key, list, default, "a list of names")
    if value is None:
        return None
    if not all(isinstance(v, str) and v for v in value):
        raise r.fail(key, "a list of names")
    return tuple(value)


def _count(r: TableReader, key: str, default: int | None, expected: str) -> int | None:
    value = r.get(key, int, default, expected)
    if value is not None and value < 0:
        raise r.fail(key, expected)
    return value  # type: ignore[no-any-return]


def _partition(r: TableReader) -> PartitionSpec:
    r.check_keys({"name", "nodes", "default", "max_time", "default_time", "priority_tier",
                  "allow_accounts", "deny_accounts", "max_gpus_per_job", "state", "requeue",
                  "sharing", "shares", "dynamic_mig", "mig_min_interval", *IDLE_KEYS})
    nodes_raw = r.table.get("nodes", "*")
    expected = "a host list such as 'gpu[01-16]', a list of them, or '*'"
    items = [nodes_raw] if isinstance(nodes_raw, str) else nodes_raw
    if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
        raise r.fail("nodes", expected)
    try:
        nodes = ("*",) if items == ["*"] else tuple(
            dict.fromkeys(n for item in items for n in expand_hostlist(item)))
    except HostlistError as exc:
        raise r.fail("nodes", f"{expected} ({exc})") from None
    state = r.get("state", str, "up", "one of up, down, drain, inactive").upper()
    if state not in PARTITION_STATES:
        raise r.fail("state", "one of up, down, drain, inactive")
    spec = PartitionSpec(
        name=r.name("name"), nodes=nodes, default=r.get("default", bool, False, "true or false"),
        max_time=r.time_limit("max_time"), default_time=r.time_limit("default_time"),
        priority_tier=_count(r, "priority_tier", 0, "a tier number (0 or more)") or 0,
        allow_accounts=_names(r, "allow_accounts"), deny_accounts=_names(r, "deny_accounts", []) or (),
        max_gpus_per_job=_count(r, "max_gpus_per_job", None, "a number of GPUs (0 or more)"),
        state=state, requeue=r.get("requeue", bool, True, "true or false"),
        **_sharing(r), **_dynamic_mig(r), **idle_policy(r),
    )
    if spec.max_time is not None and spec.default_time is not None and spec.default_time > spec.max_time:
        raise r.fail("default_time", "at most max_time")
    return spec


def _sharing(r: TableReader) -> dict[str, Any]:
    """``sharing`` (exclusive, mps or shard) and ``shares`` (1 to MAX_SHARES units per
    GPU; by default DEFAULT_SHARES; not for exclusive)."""
    expected = 'one of "exclusive", "mps", "shard"'
    sharing = r.get("sharing", str, "exclusive", expected).lower()
    if sharing not in SHARING:
        raise r.fail("sharing", expected)
    shares = r.get("shares", int, None, f"a number of units per GPU from 1 to {MAX_SHARES}")
    if sharing == "exclusive":
        if shares is not None:
            raise r.fail("shares", 'it left out with sharing = "exclusive" (shares are for '
                         '"mps" or "shard")')
        return {"sharing": None, "shares": None}
    if shares is not None and not 1 <= shares <= MAX_SHARES:
        raise r.fail("shares", f"a number of units per GPU from 1 to {MAX_SHARES}")
    return {"sharing": sharing, "shares": DEFAULT_SHARES[sharing] if shares is None else shares}


def _dynamic_mig(r: TableReader) -> dict[str, Any]:
    """``dynamic_mig`` (true or false) and ``mig_min_interval`` (a time from 1:00 to
    7-00:00:00, default 10:00)."""
    expected = "a time from '1:00' (a minute) to '7-00:00:00' (a week), such as '10:00'"
    text = r.get("mig_min_interval", str, None, expected)
    interval = DEFAULT_MIG_INTERVAL
    if text is not None:
        try:
            parsed = parse_time_limit(text)
        except TimeFormatError:
            raise r.fail("mig_min_interval", expected) from None
        if parsed is None or not MIN_MIG_INTERVAL <= parsed <= MAX_MIG_INTERVAL:
            raise r.fail("mig_min_interval", expected)
        interval = parsed
    return {"dynamic_mig": r.get("dynamic_mig", bool, False, "true or false"),
            "mig_min_interval": interval}


def _check_sharing(where: str, partitions: Iterable[PartitionSpec]) -> None:
    """A node is shared one way: two partitions that both share their GPUs, in different
    ways or counts, have no node in common ("*" has every node)."""
    shared = [p for p in partitions if p.sharing is not None]
    for i, first in enumerate(shared):
        for second in shared[i + 1:]:
            if (first.sharing, first.shares) == (second.sharing, second.shares):
                continue
            every = [p for p in (first, second) if "*" in p.nodes]
            named = (set(first.nodes) | set(second.nodes)) - {"*"}
            common = (["*"] if len(every) == 2 else sorted(named) if every
                      else sorted(set(first.nodes) & set(second.nodes)))
            if common:
                node = "every node" if common == ["*"] else f"node {common[0]}"
                raise ConfigError(
                    f"{where}: partitions {first.name!r} (sharing {first.sharing}, shares "
                    f"{first.shares}) and {second.name!r} (sharing {second.sharing}, shares "
                    f"{second.shares}) would share the GPUs of {node} differently; a node's "
                    "GPUs are shared one way")


def _qos_access(r: TableReader) -> tuple[tuple[str, ...] | None, str | None]:
    """``qos = [...]`` and ``default_qos``: the default must be one of the list."""
    allowed = _names(r, "qos")
    if allowed is not None and not allowed:
        raise r.fail("qos", "a non-empty list of QOS names")
    default = r.get("default_qos", str, None, "a QOS name")
    if default is not None and allowed is not None and default not in allowed:
        raise r.fail("default_qos", f"one of the QOS of qos = {list(allowed)}")
    return allowed, default


def _account(r: TableReader) -> AccountSpec:
    r.check_keys({"name", "parent", "shares", "qos", "default_qos", "gpu_hours",
                  "gpu_hours_period"})
    shares = _count(r, "shares", 1, "a number of shares (0 or more)")
    raw = r.table.get("gpu_hours")
    return AccountSpec(r.name("name"), r.name("parent", ROOT_ACCOUNT), shares or 0,
                       *_qos_access(r),
                       gpu_hours=None if raw is None else gpu_hours(r, "gpu_hours", raw),
                       gpu_hours_period=budget_period(r))


def _user(r: TableReader) -> UserSpec:
    r.check_keys({"name", "accounts", "default_account", "shares", "qos", "default_qos",
                  "max_submit_jobs", "gpu_hours", "gpu_hours_period"})
    accounts = _names(r, "accounts")
    if not accounts:
        raise r.fail("accounts", "a non-empty list of account names")
    default = r.get("default_account", str, accounts[0], "one of the user's accounts")
    if default not in accounts:
        raise r.fail("default_account", f"one of the user's accounts {list(accounts)}")
    shares = _count(r, "shares", 1, "a number of shares (0 or more)")
    return UserSpec(r.name("name"), accounts, default, shares or 0, *_qos_access(r),
                    max_submit_jobs=_count(r, "max_submit_jobs", None,
                                           "a number of jobs (0 or more)"),
                    gpu_hours=user_budgets(r, accounts), gpu_hours_period=budget_period(r))


def _qos(r: TableReader) -> QosSpec:
    r.check_keys({"name", "priority", "max_gpus_per_user", "max_jobs_per_user", "grp_gpus",
                  "max_wall", "preempt", "max_submit_jobs_per_user", *IDLE_KEYS})
    return QosSpec(
        name=r.name("name"),
        priority=_count(r, "priority", 0, "a priority (0 or more)") or 0,
        max_gpus_per_user=_count(r, "max_gpus_per_user", None, "a number of GPUs (0 or more)"),
        max_jobs_per_user=_count(r, "max_jobs_per_user", None, "a number of jobs (0 or more)"),
        grp_gpus=_count(r, "grp_gpus", None, "a number of GPUs (0 or more)"),
        max_wall=r.time_limit("max_wall"),
        preempt=_names(r, "preempt", []) or (),
        max_submit_jobs_per_user=_count(r, "max_submit_jobs_per_user", None,
                                        "a number of jobs (0 or more)"),
        **idle_policy(r),
    )


def _billing(r: TableReader) -> dict[str, float]:
    weights: dict[str, float] = {}
    for gpu_type in r.table:
        if not _GPU_TYPE.match(gpu_type):
            raise r.fail(gpu_type, "a GPU type such as 'h100-80gb' (lower case)")
        weights[gpu_type] = r.positive(gpu_type, 1.0)
    return weights


@dataclass(frozen=True)
class NodeSpec:
    """``[[node]]``: features the admin gives nodes, by name or host list."""

    names: tuple[str, ...]
    features: tuple[str, ...]


def _node(r: TableReader) -> NodeSpec:
    from gpusched.core.features import check_features

    r.check_keys({"name", "features"})
    name = r.get("name", str, None, "a node name or host list such as 'gpu[01-16]'")
    try:
        names = tuple(dict.fromkeys(expand_hostlist(name or "")))
    except HostlistError as exc:
        raise r.fail("name", f"a node name or host list ({exc})") from None
    if not names:
        raise r.fail("name", "a node name or host list such as 'gpu[01-16]'")
    try:
        features = check_features(r.table.get("features", []), "features")
    except UsageError as exc:
        raise r.fail("features", exc.message.removeprefix("features: ")) from None
    return NodeSpec(names, features)


_TABLES = {"partition": _partition, "account": _account, "user": _user, "qos": _qos,
           "node": _node}


def _entries(source: str, data: dict[str, Any], kind: str) -> list[Any] | None:
    raw = data.get(kind)
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(e, dict) for e in raw):
        raise ConfigError(f"{source}: {kind}: expected an array of tables [[{kind}]]")
    return [_TABLES[kind](TableReader(source, e, f"{kind}[{i}].")) for i, e in enumerate(raw)]


def _unique(source: str, kind: str, names: Iterable[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ConfigError(f"{source}: {kind}: {name!r} is declared twice")
        seen.add(name)


def _merge(found: dict[str, list[Any]], kind: str, entries: list[Any] | None) -> None:
    if entries is not None:
        found.setdefault(kind, []).extend(entries)


def load_admin_config(paths: Iterable[Path]) -> AdminConfig:
    """Read and validate admin files as one whole; raise ConfigError naming file and key."""
    return parse_admin_config([(str(path), read_toml(path)) for path in paths])


def parse_admin_config(files: Iterable[tuple[str, dict[str, Any]]]) -> AdminConfig:
    """Validate parsed admin files (source name, TOML data) as one whole."""
    found: dict[str, list[Any]] = {}
    billing: dict[str, float] | None = None
    licenses: dict[str, int] | None = None
    sources = []
    for source, data in files:
        sources.append(source)
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a TOML document")
        TableReader(source, data, "").check_keys({*_TABLES, "billing", "licenses"})
        for kind in _TABLES:
            _merge(found, kind, _entries(source, data, kind))
        if "billing" in data:
            billing = {**(billing or {}), **_billing(TableReader(source, data, "").sub("billing"))}
        if "licenses" in data:
            licenses = {**(licenses or {}), **license_counts(TableReader(source, data, "").sub("licenses"))}
    if not sources:
        raise ConfigError("no admin configuration files given")
    where = ", ".join(sources)
    config = AdminConfig(
        partitions=tuple(found["partition"]) if "partition" in found else None,
        accounts=tuple(found["account"]) if "account" in found else None,
        users=tuple(found["user"]) if "user" in found else None,
        qos=tuple(found["qos"]) if "qos" in found else None,
        billing=billing, licenses=licenses, sources=tuple(sources),
        nodes=tuple(found["node"]) if "node" in found else None,
    )
    _check_whole(where, config)
    return config


def _check_whole(where: str, config: AdminConfig) -> None:
    """Cross-references: names unique, parents and accounts exist, no cycles."""
    for kind, items in (("partition", config.partitions), ("account", config.accounts),
                        ("user", config.users), ("qos", config.qos)):
        if items:
            _unique(where, kind, (i.name for i in items))
    _unique(where, "node", (name for spec in config.nodes or () for name in spec.names))
    if config.partitions is not None and sum(p.default for p in config.partitions) > 1:
        raise ConfigError(f"{where}: partition: at most one may have default = true")
    _check_sharing(where, config.partitions or ())
    accounts = {a.name: a for a in config.accounts or ()}
    if ROOT_ACCOUNT in accounts:
        raise ConfigError(f"{where}: account: {ROOT_ACCOUNT!r} is implicit; do not declare it")
    for account in accounts.values():
        seen = {account.name}
        parent = account.parent
        while parent != ROOT_ACCOUNT:
            if parent not in accounts:
                raise ConfigError(f"{where}: account {account.name!r}: parent {parent!r} is not declared")
            if parent in seen:
                raise ConfigError(f"{where}: account {account.name!r}: the parents form a cycle")
            seen.add(parent)
            parent = accounts[parent].parent
    if config.users is not None:
        if config.accounts is None:
            raise ConfigError(f"{where}: user: users need the [[account]] tables in the same apply")
        for user in config.users:
            for name in user.accounts:
                if name not in accounts:
                    raise ConfigError(f"{where}: user {user.name!r}: account {name!r} is not declared")
    qos_names = {q.name for q in config.qos or ()}
    if config.qos is not None:
        for kind, items in (("account", config.accounts or ()), ("user", config.users or ())):
            for item in items:
                for name in (*(item.qos or ()), *([item.default_qos] if item.default_qos else [])):
                    if name not in qos_names:
                        raise ConfigError(f"{where}: {kind} {item.name!r}: QOS {name!r} is not "
                                          "declared")
    for qos in config.qos or ():
        for target in qos.preempt:
            if target not in qos_names or target == qos.name:
                raise ConfigError(f"{where}: qos {qos.name!r}: preempt: {target!r} is not another "
                                  f"declared QOS")
    if config.partitions is not None and config.accounts is not None:
        for part in config.partitions:
            for name in (part.allow_accounts or ()) + part.deny_accounts:
                if name not in accounts:
                    raise ConfigError(f"{where}: partition {part.name!r}: account {name!r} is "
                                      f"not declared")
