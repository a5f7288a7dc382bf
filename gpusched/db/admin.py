"""Apply an admin configuration: the difference from the database, then the change.

Each kind present in the configuration (partitions, accounts, users, QOS, billing,
licenses) is the complete desired set of that kind. Partitions are never deleted (ended jobs refer
to them): one no longer listed becomes INACTIVE.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from gpusched.adminconfig import (
    DEFAULT_MIG_INTERVAL,
    ROOT_ACCOUNT,
    AdminConfig,
    PartitionSpec,
)
from gpusched.core.timefmt import format_duration
from gpusched.db.models import (
    Account,
    AccountUser,
    GpuBilling,
    License,
    NodeFeatures,
    Partition,
    Qos,
)
from gpusched.errors import ConfigError

Row = dict[str, Any]
_TIMES = {"max_time", "default_time", "max_wall", "mig_min_interval", "idle_warn_after",
          "idle_action_after"}
_IDLE = ("idle_warn_after", "idle_action", "idle_action_after")
# Fields a new row shows only when not at these defaults (dynamic MIG is seldom on).
_QUIET = {"dynamic_mig": False, "mig_min_interval": DEFAULT_MIG_INTERVAL,
          "gpu_hours_period": "none"}


def _show(key: str, value: Any) -> str:
    if key in _IDLE and value is None:
        return "none"
    if key in _TIMES:
        return format_duration(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def _diff_rows(kind: str, current: Mapping[str, Row], desired: Mapping[str, Row]) -> list[str]:
    """Lines ``+ kind name (...)`` and ``~ kind name: key old -> new``; removals are the caller's."""
    lines = []
    for name, row in desired.items():
        if name not in current:
            fields = ", ".join(f"{k} {_show(k, v)}" for k, v in row.items()
                               if v not in (None, (), []) and (k not in _QUIET or v != _QUIET[k]))
            lines.append(f"+ {kind} {name}" + (f" ({fields})" if fields else ""))
            continue
        changes = [f"{k} {_show(k, current[name].get(k))} -> {_show(k, v)}"
                   for k, v in row.items() if _norm(current[name].get(k)) != _norm(v)]
        if changes:
            lines.append(f"~ {kind} {name}: " + "; ".join(changes))
    return lines


def _norm(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _partition_row(p: PartitionSpec) -> Row:
    return {"nodes": list(p.nodes), "is_default": p.default, "max_time": p.max_time,
            "default_time": p.default_time, "priority_tier": p.priority_tier,
            "allow_accounts": list(p.allow_accounts) if p.allow_accounts is not None else None,
            "deny_accounts": list(p.deny_accounts), "max_gpus_per_job": p.max_gpus_per_job,
            "state": p.state, "requeue": p.requeue, "sharing": p.sharing, "shares": p.shares,
            "dynamic_mig": p.dynamic_mig, "mig_min_interval": p.mig_min_interval,
            **{key: getattr(p, key) for key in _IDLE}}


def _current(session: Session, model: Any, key: str, columns: list[str]) -> dict[str, Row]:
    return {getattr(r, key): {c: getattr(r, c) for c in columns}
            for r in session.scalars(select(model))}


def _list(names: tuple[str, ...] | None) -> list[str] | None:
    return None if names is None else list(names)


_BUDGET = ["gpu_hours", "gpu_hours_period"]  # a GPU-hour budget (core/budgets.py)
_ACCOUNT_COLUMNS = ["parent", "shares", "qos", "default_qos", *_BUDGET]
_USER_COLUMNS = ["shares", "is_default", "qos", "default_qos", "max_submit_jobs", *_BUDGET]
_QOS_COLUMNS = ["priority", "max_gpus_per_user", "max_jobs_per_user", "grp_gpus", "max_wall",
                "preempt", "max_submit_jobs_per_user", *_IDLE]


def desired_state(config: AdminConfig) -> dict[str, dict[str, Row]]:
    """The rows each kind of the configuration asks for, keyed by name."""
    state: dict[str, dict[str, Row]] = {}
    if config.partitions is not None:
        state["partition"] = {p.name: _partition_row(p) for p in config.partitions}
    if config.accounts is not None:
        state["account"] = {a.name: {"parent": a.parent, "shares": a.shares,
                                     "qos": _list(a.qos), "default_qos": a.default_qos,
                                     "gpu_hours": a.gpu_hours,
                                     "gpu_hours_period": a.gpu_hours_period}
                            for a in config.accounts}
    if config.users is not None:
        state["user"] = {f"{u.name}@{a}": {"shares": u.shares, "is_default": a == u.default_account,
                                           "qos": _list(u.qos), "default_qos": u.default_qos,
                                           "max_submit_jobs": u.max_submit_jobs,
                                           "gpu_hours": dict(u.gpu_hours).get(a),
                                           "gpu_hours_period": u.gpu_hours_period}
                         for u in config.users for a in u.accounts}
    if config.qos is not None:
        state["qos"] = {q.name: {"priority": q.priority, "max_gpus_per_user": q.max_gpus_per_user,
                                 "max_jobs_per_user": q.max_jobs_per_user, "grp_gpus": q.grp_gpus,
                                 "max_wall": q.max_wall, "preempt": list(q.preempt),
                                 "max_submit_jobs_per_user": q.max_submit_jobs_per_user,
                                 **{key: getattr(q, key) for key in _IDLE}}
                        for q in config.qos}
    if config.billing is not None:
        state["billing"] = {t: {"weight": w} for t, w in config.billing.items()}
    if config.licenses is not None:
        state["license"] = {n: {"count": c} for n, c in config.licenses.items()}
    if config.nodes is not None:
        state["node"] = {name: {"features": list(spec.features)}
                         for spec in config.nodes for name in spec.names}
    return state


def current_state(session: Session, kinds: set[str]) -> dict[str, dict[str, Row]]:
    """The stored rows of ``kinds``, in the shape of ``desired_state``."""
    state: dict[str, dict[str, Row]] = {}
    if "partition" in kinds:
        state["partition"] = _current(session, Partition, "name", list(_partition_row(
            PartitionSpec("x"))))
    if "account" in kinds:
        state["account"] = {k: v for k, v in _current(session, Account, "name",
                                                      _ACCOUNT_COLUMNS).items() if k != ROOT_ACCOUNT}
    if "user" in kinds:
        state["user"] = {f"{u.user_name}@{u.account}": {c: getattr(u, c) for c in _USER_COLUMNS}
                         for u in session.scalars(select(AccountUser))}
    if "qos" in kinds:
        state["qos"] = _current(session, Qos, "name", _QOS_COLUMNS)
    if "billing" in kinds:
        state["billing"] = {b.gpu_type: {"weight": b.weight} for b in session.scalars(select(GpuBilling))}
    if "license" in kinds:
        state["license"] = {lic.name: {"count": lic.count} for lic in session.scalars(select(License))}
    if "node" in kinds:
        state["node"] = {n.node: {"features": list(n.features)}
                         for n in session.scalars(select(NodeFeatures))}
    return state


def plan_changes(session: Session, config: AdminConfig) -> list[str]:
    """The difference between the database and ``config``, one line per change."""
    desired = desired_state(config)
    if "account" in desired and "user" not in desired:
        # Users stay, except those whose account goes away.
        kept = current_state(session, {"user"})["user"]
        desired["user"] = {k: v for k, v in kept.items() if k.split("@", 1)[1] in desired["account"]}
    current = current_state(session, set(desired))
    _check_qos_names(session, desired)
    lines: list[str] = []
    for kind, rows in desired.items():
        lines += _diff_rows(kind, current[kind], rows)
        gone = [name for name in current[kind] if name not in rows]
        if kind == "partition":  # never deleted: ended jobs refer to them
            lines += [f"~ partition {name}: state -> INACTIVE" for name in gone
                      if current[kind][name]["state"] != "INACTIVE"]
        else:
            lines += [f"- {kind} {name}" for name in gone]
    return lines


def _check_qos_names(session: Session, desired: dict[str, dict[str, Row]]) -> None:
    """Every QOS an account or user may use exists: declared in this apply, or stored
    when this apply declares none."""
    known = set(desired["qos"]) if "qos" in desired else set(session.scalars(select(Qos.name)))
    for kind in ("account", "user"):
        for name, row in desired.get(kind, {}).items():
            for qos in (*(row["qos"] or ()), *([row["default_qos"]] if row["default_qos"] else [])):
                if qos not in known:
                    shown = name.split("@", 1)[0]
                    raise ConfigError(f"{kind} {shown!r}: QOS {qos!r} does not exist")


def apply_config(session: Session, config: AdminConfig) -> list[str]:
    """Make the database match ``config`` inside the caller's transaction; the changes."""
    changes = plan_changes(session, config)
    desired = desired_state(config)
    if "account" in desired and "user" not in desired:
        session.execute(delete(AccountUser).where(AccountUser.account.not_in(list(desired["account"]))))
    if "partition" in desired:
        for name, row in desired["partition"].items():
            session.execute(insert(Partition).values(name=name, **row)
                            .on_conflict_do_update(index_elements=[Partition.name], set_=row))
        session.execute(Partition.__table__.update()  # type: ignore[attr-defined]
                        .where(Partition.name.not_in(list(desired["partition"])))
                        .values(state="INACTIVE", is_default=False))
    if "user" in desired:
        session.execute(delete(AccountUser))
    if "account" in desired:
        _replace_accounts(session, config)
    if "user" in desired:
        for key, row in desired["user"].items():
            user, account = key.split("@", 1)
            session.add(AccountUser(user_name=user, account=account, **row))
    if "qos" in desired:
        session.execute(delete(Qos))
        session.add_all(Qos(name=name, **row) for name, row in desired["qos"].items())
    if "billing" in desired:
        session.execute(delete(GpuBilling))
        session.add_all(GpuBilling(gpu_type=t, **row) for t, row in desired["billing"].items())
    if "license" in desired:
        session.execute(delete(License))
        session.add_all(License(name=n, **row) for n, row in desired["license"].items())
    if "node" in desired:
        session.execute(delete(NodeFeatures))
        session.add_all(NodeFeatures(node=n, **row) for n, row in desired["node"].items())
    session.flush()
    return changes


def _replace_accounts(session: Session, config: AdminConfig) -> None:
    # Upsert parents before children, then delete what is gone, children first; rows
    # that stay keep their user associations (the foreign key cascades on delete).
    session.execute(insert(Account).values(name=ROOT_ACCOUNT, parent=None, shares=1)
                    .on_conflict_do_nothing())
    pending = {a.name: a for a in config.accounts or ()}
    placed = {ROOT_ACCOUNT}
    while pending:
        ready = sorted((a for a in pending.values() if a.parent in placed), key=lambda a: a.name)
        if not ready:  # validation rules this out; never loop forever on a bad tree
            raise ConfigError(f"accounts without a path to root: {sorted(pending)}")
        for account in ready:
            values = {"parent": account.parent, "shares": account.shares,
                      "qos": _list(account.qos), "default_qos": account.default_qos,
                      "gpu_hours": account.gpu_hours,
                      "gpu_hours_period": account.gpu_hours_period}
            session.execute(insert(Account).values(name=account.name, **values)
                            .on_conflict_do_update(index_elements=[Account.name], set_=values))
            placed.add(account.name)
            del pending[account.name]
    existing = {a.name: a.parent for a in session.scalars(select(Account))}
    for name in _deepest_first(existing):
        if name not in placed:
            session.execute(delete(Account).where(Account.name == name))


def _deepest_first(parents: Mapping[str, str | None]) -> list[str]:
    def depth(name: str) -> int:
        d, parent = 0, parents.get(name)
        while parent is not None and d < len(parents):
            d, parent = d + 1, parents.get(parent)
        return d
    return sorted(parents, key=depth, reverse=True)
