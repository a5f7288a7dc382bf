"""GPU-hour budgets (Slurm's GrpTRESMins for gres/gpu): periods, and what a pass may
still start within them.

A budget belongs to an account (it covers the jobs of the account and of every account
under it in the tree, as Slurm's association limits do) or to a user in one account
(that user's jobs charged to that account). Its period is ``none`` (the budget is for
all time), ``month``, ``quarter`` or ``year``; a period begins at its boundary in UTC
(the first of the month, of January/April/July/October, of January, at 00:00), and the
usage counted against the budget is the GPU-time of runs inside the current period.

A job may start only if its most GPU-hours (its GPUs times its time limit, a share of
a GPU counting as its fraction, as accounting counts it) fit in what is left of every
budget that covers it: the budget, less what was used in the period, less what running
jobs under it may still use up to their time limits (and the jobs the pass started
already). A job that does not fit waits with reason ``AssocGrpGRESMinutes``.

Pure: the caller passes the time (``as_of``, ``now``); no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from gpusched.core.usage import gpu_fraction

if TYPE_CHECKING:
    from gpusched.core.fairshare import Account
    from gpusched.core.model import NodeView, PartitionView, PendingJob, RunningJob

PERIODS = ("none", "month", "quarter", "year")
MAX_GPU_HOURS = 1_000_000_000.0  # the largest budget an admin may set
# Sums of GPU-seconds in floating point: a job that fits to within this many
# GPU-seconds fits.
TOLERANCE = 1e-6
_MONTHS = {"month": 1, "quarter": 3, "year": 12}


def period_start(period: str, at: float) -> float | None:
    """When the period holding ``at`` (epoch seconds) began, in UTC; None for ``none``
    (all time)."""
    if period == "none":
        return None
    months = _MONTHS[period]
    day = datetime.fromtimestamp(at, UTC)
    month = (day.month - 1) // months * months + 1
    return datetime(day.year, month, 1, tzinfo=UTC).timestamp()


def period_after(period: str, start: float) -> float | None:
    """When the period that began at ``start`` ends (the next one begins)."""
    if period == "none":
        return None
    day = datetime.fromtimestamp(start, UTC)
    index = day.year * 12 + day.month - 1 + _MONTHS[period]
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC).timestamp()


def periods_between(period: str, start: float, end: float,
                    most: int = 120) -> list[tuple[float | None, float | None]]:
    """The periods that overlap [``start``, ``end``), oldest first, as (begin, end)
    (``none``: one, (None, None)); at most ``most`` of them, the latest."""
    if period == "none":
        return [(None, None)]
    found: list[tuple[float | None, float | None]] = []
    begin: float | None = period_start(period, start)
    while begin is not None and begin < end:
        after = period_after(period, begin)
        found.append((begin, after))
        begin = after
    return found[-most:]


@dataclass(frozen=True, slots=True)
class Budget:
    """One budget and what was used against it in its current period: ``used_s``
    GPU-seconds as of ``as_of`` (runs that ended, and running runs until then)."""

    account: str
    user: str | None  # None: the account's own (and its sub-accounts'); else one user's
    gpu_hours: float
    period: str = "none"
    used_s: float = 0.0
    as_of: float = 0.0

    @property
    def key(self) -> tuple[str, str | None]:
        """(account, user): at most one budget of each."""
        return (self.account, self.user)

    @property
    def limit_s(self) -> float:
        """The budget in GPU-seconds."""
        return self.gpu_hours * 3600.0

    @property
    def who(self) -> str:
        """The budget's owner in words."""
        return (f"account {self.account}" if self.user is None
                else f"user {self.user} in account {self.account}")


@dataclass(frozen=True, slots=True)
class BudgetState:
    """A budget as a pass saw it at one job: GPU-seconds committed (used, what running
    jobs may still use, what the pass started) and what the job may use."""

    budget: Budget
    committed_s: float
    job_s: float
    gpus: float = 0.0  # the job's GPUs, as counted

    @property
    def left_s(self) -> float:
        """GPU-seconds of the budget not committed."""
        return max(0.0, self.budget.limit_s - self.committed_s)


def ancestors(parents: Mapping[str, str | None], account: str) -> Iterator[str]:
    """``account`` and the accounts above it, nearest first (a cycle ends the walk)."""
    seen: set[str] = set()
    name: str | None = account
    while name is not None and name not in seen:
        seen.add(name)
        yield name
        name = parents.get(name)


def covered_accounts(keys: Iterable[tuple[str, str | None]],
                     parents: Mapping[str, str | None]) -> frozenset[str]:
    """The accounts whose jobs some budget of ``keys`` ((account, user) each) covers:
    those with a user's budget, an account's and every account under it."""
    keys = list(keys)
    by_account = {account for account, user in keys if user is None}
    by_user = {account for account, user in keys if user is not None}
    return frozenset(
        name for name in set(parents) | by_account | by_user
        if name in by_user or any(a in by_account for a in ancestors(parents, name)))


def covers(key: tuple[str, str | None], user: str, account: str,
           parents: Mapping[str, str | None]) -> bool:
    """Whether the budget of ``key`` covers ``user``'s jobs in ``account``."""
    owner, owner_user = key
    if owner_user is not None:
        return (owner, owner_user) == (account, user)
    return owner in ancestors(parents, account)


def most_gpu_seconds(gpus: float, time_limit: int | None) -> float:
    """What a job of ``gpus`` GPUs may use: its GPUs times its time limit (unbounded
    without one)."""
    return math.inf if time_limit is None else gpus * time_limit


class BudgetBook:
    """Budgets during a pass: GPU-seconds committed against each, updated as the pass
    starts jobs, and whether one more job fits."""

    def __init__(self, budgets: Iterable[Budget], accounts: Iterable[Account],
                 running: Iterable[RunningJob], nodes: Iterable[NodeView] = (),
                 partitions: Iterable[PartitionView] = ()) -> None:
        self.budgets = {budget.key: budget for budget in budgets}
        self.parents: dict[str, str | None] = {a.name: a.parent for a in accounts}
        self.nodes = tuple(nodes)
        self.shares = {p.name: p.shares for p in partitions}
        self._scopes: dict[tuple[str, str], tuple[tuple[str, str | None], ...]] = {}
        # Accounts whose jobs some budget covers: the pass looks only at their jobs.
        self.accounts = covered_accounts(self.budgets, self.parents)
        self._widest: float | None = None
        self.committed = {key: budget.used_s for key, budget in self.budgets.items()}
        offered: dict[str, int] | None = None
        for job in running:
            if job.account is None or job.account not in self.accounts or job.end_time is None:
                continue  # a job without a time limit commits only what it used
            if job.shares and offered is None:
                offered = {gpu.uuid: gpu.shares for node in self.nodes for gpu in node.gpus
                           if gpu.sharing is not None}
            gpus = len(job.gpu_uuids) + sum(gpu_fraction(units, (offered or {}).get(uuid))
                                            for uuid, units, _ in job.shares)
            for key in self.scope(job.user, job.account):
                as_of = self.budgets[key].as_of
                self.committed[key] += gpus * max(0.0, job.end_time - as_of)
        # What each budget has room for, as ``fits`` compares it.
        self._room = {key: self.budgets[key].limit_s + TOLERANCE - committed
                      for key, committed in self.committed.items()}

    def scope(self, user: str, account: str) -> tuple[tuple[str, str | None], ...]:
        """The keys of the budgets covering ``user``'s jobs in ``account``: the user's
        own there, then the account's and those of the accounts above it."""
        found = self._scopes.get((user, account))
        if found is None:
            keys: list[tuple[str, str | None]] = []
            if (account, user) in self.budgets:
                keys.append((account, user))
            keys.extend((name, None) for name in ancestors(self.parents, account)
                        if (name, None) in self.budgets)
            found = self._scopes[(user, account)] = tuple(keys)
        return found

    def gpus(self, job: PendingJob) -> float:
        """The GPUs ``job`` may hold, a share as its fraction of the GPU; an exclusive
        job as every GPU (or MIG slice) of the largest node, on each of its nodes."""
        if job.share:
            return gpu_fraction(job.share, self.shares.get(job.partition)) * max(1, job.nodes)
        if job.exclusive:
            if self._widest is None:
                self._widest = float(max((sum(1 for gpu in node.gpus if not gpu.mig_mode)
                                          for node in self.nodes), default=0))
            return max(float(job.gpus), self._widest) * max(1, job.nodes)
        return float(job.total_gpus)

    def states(self, job: PendingJob) -> list[BudgetState]:
        """Every budget covering ``job``, as committed now, with what the job may use."""
        if job.account is None or job.account not in self.accounts:
            return []
        gpus = self.gpus(job)
        need = most_gpu_seconds(gpus, job.time_limit)
        return [BudgetState(self.budgets[key], self.committed[key], need, gpus)
                for key in self.scope(job.user, job.account)]

    def fits(self, job: PendingJob) -> bool:
        """Whether ``job`` fits every budget covering it (``over`` is empty); a pass asks
        this of every job of a budgeted account, so it builds nothing."""
        if job.account is None:
            return True
        keys = self._scopes.get((job.user, job.account))
        if keys is None:
            keys = self.scope(job.user, job.account)
        if not keys:
            return True
        if job.time_limit is None:
            return False
        need = (self.gpus(job) if job.share or job.exclusive
                else job.gpus * job.nodes) * job.time_limit
        room = self._room
        for key in keys:
            if need > room[key]:
                return False
        return True

    def over(self, job: PendingJob) -> list[BudgetState]:
        """The budgets ``job`` would exceed if it started now (empty: it fits)."""
        return [state for state in self.states(job)
                if state.committed_s + state.job_s > state.budget.limit_s + TOLERANCE]

    def started(self, job: PendingJob) -> None:
        """Commit what a job the pass starts may use to every budget covering it."""
        for state in self.states(job):
            key = state.budget.key
            self.committed[key] += state.job_s
            self._room[key] = state.budget.limit_s + TOLERANCE - self.committed[key]

    def balance(self, key: tuple[str, str | None]) -> tuple[float, float, float]:
        """GPU-seconds of budget ``key``: used in its period, what running jobs may still
        use, and what is left."""
        budget = self.budgets[key]
        committed = self.committed[key]
        return (budget.used_s, max(0.0, committed - budget.used_s),
                max(0.0, budget.limit_s - committed))
