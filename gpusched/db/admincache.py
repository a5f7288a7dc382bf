"""The admin-configured part of a pass's snapshot (partitions, accounts, users' shares
in them, QOS, GPU-hour budgets, licenses), and a copy of it kept between passes.

Every write to those tables sends an ``admin`` NOTIFY from a trigger, inside the
writing transaction (migration 0017): it is heard once the change is committed, and
whatever made the change (``gpusched admin apply``, the seeding of partitions, a
hand-written UPDATE) cannot forget it. The controller's listener counts what it hears
into a generation (controller/events.py). A kept copy is used only while that listener
is connected and its generation has not moved since the copy was read, and for at most
``max_age`` seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from gpusched.adminconfig import ROOT_ACCOUNT
from gpusched.core.fairshare import Account as CoreAccount
from gpusched.core.fairshare import UserShare
from gpusched.core.model import PartitionView, QosLimits
from gpusched.core.reservations import AdvanceReservation
from gpusched.db.models import Account, AccountUser, License, Partition, Qos
from gpusched.db.reservations import read_reservations

EVERY_NODE = "*"  # a partition's node list that means every node, as they come and go

# Every budget as a JSON array of columns [accounts, users (null: the account's own),
# GPU-hours, periods] (null for none), read with the admin tables (and by db/retention.py).
BUDGETS = (
    "(SELECT json_build_array(json_agg(b.account), json_agg(b.user_name), "
    "json_agg(b.gpu_hours), json_agg(b.gpu_hours_period)) FROM ("
    "SELECT name AS account, NULL AS user_name, gpu_hours, gpu_hours_period FROM accounts "
    "WHERE gpu_hours IS NOT NULL UNION ALL "
    "SELECT account, user_name, gpu_hours, gpu_hours_period FROM account_users "
    "WHERE gpu_hours IS NOT NULL) AS b)")
_BUDGETS = text("SELECT " + BUDGETS)


def read_budgets(session: Session) -> list[tuple[str, str | None, float, str]]:
    """Every budget the admin configuration set, as ``budget_rows`` gives them."""
    return budget_rows(session.connection().execute(_BUDGETS).scalar_one())


def budget_rows(columns: Sequence[Sequence[Any] | None]) -> list[tuple[str, str | None, float, str]]:
    """The rows of a BUDGETS answer: (account, user or None, GPU-hours, period)."""
    if not columns or columns[0] is None:
        return []
    return [(a, u, float(h), p) for a, u, h, p in zip(*(c or () for c in columns))]


@dataclass(frozen=True)
class AdminTables:
    """What a pass reads from the admin-configured tables.

    A partition of every node is kept with no node names (``every_node`` names it):
    the nodes are the pass's own.
    """

    partitions: tuple[PartitionView, ...]
    every_node: frozenset[str]
    accounts: tuple[CoreAccount, ...]
    user_shares: tuple[UserShare, ...]
    qos_priority: Mapping[str, int]
    qos_limits: Mapping[str, QosLimits]
    qos_preempt: Mapping[str, frozenset[str]]
    # Partitions with dynamic MIG on: the seconds between two layout changes of one GPU.
    dynamic_mig: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    # GPU-hour budgets: (account, user or None for the account's own, GPU-hours, period).
    budgets: tuple[tuple[str, str | None, float, str], ...] = ()
    # Licenses (sbatch's -L): the cluster's count of each, by name.
    licenses: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    reservations: tuple[AdvanceReservation, ...] = ()  # advance reservations, by name

    def partitions_over(self, node_names: tuple[str, ...]) -> tuple[PartitionView, ...]:
        """The partitions, those of every node given ``node_names``."""
        if not self.every_node:
            return self.partitions
        return tuple(replace(p, nodes=node_names) if p.name in self.every_node else p
                     for p in self.partitions)


def load_admin_tables(session: Session) -> AdminTables:
    """Read the admin-configured tables, six queries."""
    partitions, every_node, dynamic_mig = [], set(), {}
    for (name, members, state, tier, max_time, allow, deny, max_gpus, sharing,
         shares, dynamic, interval) in session.execute(
            select(Partition.name, Partition.nodes, Partition.state, Partition.priority_tier,
                   Partition.max_time, Partition.allow_accounts, Partition.deny_accounts,
                   Partition.max_gpus_per_job, Partition.sharing,
                   Partition.shares, Partition.dynamic_mig,
                   Partition.mig_min_interval).order_by(Partition.name)):
        if dynamic:
            dynamic_mig[name] = interval
        if EVERY_NODE in members:
            every_node.add(name)
        # DRAIN refuses new submissions but still runs what is queued (as in Slurm).
        partitions.append(PartitionView(
            name, () if EVERY_NODE in members else tuple(members), state in ("UP", "DRAIN"),
            tier, max_time, None if allow is None else frozenset(allow), frozenset(deny),
            max_gpus, sharing, shares or 0))
    qos_rows = session.execute(select(Qos.name, Qos.priority, Qos.max_gpus_per_user,
                                      Qos.max_jobs_per_user, Qos.grp_gpus, Qos.preempt)).all()
    # Read-only views: a kept copy is shared by every pass that uses it.
    return AdminTables(
        partitions=tuple(partitions), every_node=frozenset(every_node),
        accounts=tuple(CoreAccount(name, parent, shares) for name, parent, shares in
                       session.execute(select(Account.name, Account.parent, Account.shares))
                       if name != ROOT_ACCOUNT),
        user_shares=tuple(UserShare(user, account, shares) for user, account, shares in
                          session.execute(select(AccountUser.user_name, AccountUser.account,
                                                 AccountUser.shares))),
        qos_priority=MappingProxyType({name: priority for name, priority, *_ in qos_rows}),
        qos_limits=MappingProxyType({name: QosLimits(gpus, jobs, grp)
                                     for name, _, gpus, jobs, grp, _ in qos_rows}),
        qos_preempt=MappingProxyType({name: frozenset(preempt)
                                      for name, *_, preempt in qos_rows if preempt}),
        dynamic_mig=MappingProxyType(dynamic_mig),
        budgets=tuple(read_budgets(session)),
        licenses=MappingProxyType({name: count for name, count in
                                   session.execute(select(License.name, License.count))}),
        reservations=read_reservations(session),
    )


class AdminCache:
    """The admin tables as last read, kept while nothing says they changed.

    ``generation`` gives the count of possible changes heard so far, or None while
    no one is listening for them (then every pass reads the tables). The generation
    is taken before the tables are read, so a change heard during a read leaves the
    copy already out of date. ``loads`` counts reads of the tables.
    """

    def __init__(self, generation: Callable[[], int | None], max_age: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.generation = generation
        self.max_age = max_age  # seconds; 0: never keep a copy
        self.clock = clock
        self.loads = 0
        self._lock = threading.Lock()
        self._kept: tuple[AdminTables, int, float] | None = None  # tables, generation, read at
        self._drops = 0
        self.last: AdminTables | None = None  # what the latest call of tables() gave

    def tables(self, session: Session) -> AdminTables:
        """The kept copy if still good, else the tables read now (and kept)."""
        generation, now = self.generation(), self.clock()
        with self._lock:
            kept, drops = self._kept, self._drops
        if (kept is not None and generation is not None and kept[1] == generation
                and now - kept[2] < self.max_age):
            self.last = kept[0]
            return kept[0]
        tables = self.last = load_admin_tables(session)
        with self._lock:
            self.loads += 1
            if generation is not None and drops == self._drops:
                self._kept = (tables, generation, now)
        return tables

    def drop(self) -> None:
        """Forget the kept copy: the next pass reads the tables (a new leader's first)."""
        with self._lock:
            self._kept = None
            self._drops += 1
