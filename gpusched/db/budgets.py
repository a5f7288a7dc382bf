"""GPU-hour budgets in the database: the budgets the admin configuration set (columns
of ``accounts`` and ``account_users``), and the GPU-time used against them in a period
(from the allocations: ended runs for the time they held their GPUs, running runs until
now; a share of a GPU as its fraction, as accounting counts it).

A pass reads the budgets with the admin tables (db/admincache.py: kept between passes
while no admin change is heard) and, only when there are some, their usage, in one statement over the allocations of
the accounts the budgets cover, in two parts. Up to a settled moment (a minute's
boundary at least ``_MARGIN`` seconds ago) the usage of each period is kept between
passes, and extended by the minutes settled since (the allocations released since the
last settled moment, ``ix_allocations_released_at``, and those still held); from the
settled moment to now it is read every time. A run's end is written with the start
time of its short transaction, so a release dated before the settled moment and
committed after it was read is as unlikely as a transaction held open for ``_MARGIN``
seconds; and every ``_RENEW`` seconds a period's usage is read again from its start.
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from gpusched.core.budgets import (
    Budget,
    BudgetBook,
    covered_accounts,
    covers,
    period_after,
    period_start,
    periods_between,
)
from gpusched.core.fairshare import Account
from gpusched.core.model import Snapshot
from gpusched.core.usage import gpu_fraction
from gpusched.db.admincache import BUDGETS as BUDGETS
from gpusched.db.admincache import budget_rows as budget_rows
from gpusched.db.admincache import read_budgets
from gpusched.db.usage import ShareOffers

_TREE = text("SELECT name, parent FROM accounts")
# GPU-seconds held within each window [begin, end) (epoch seconds) by the jobs of the
# given accounts, by window (its place, from 1), account, user and what the seconds
# need to count a share as its fraction (units, node, partition).
_USAGE = text(
    "SELECT w.i, j.account, j.user_name, al.units, n.name, j.partition, "
    "sum(greatest(0, extract(epoch FROM least(coalesce(al.released_at, to_timestamp(:now)), "
    "to_timestamp(w.e)) - greatest(al.allocated_at, to_timestamp(w.b))))) "
    "FROM unnest(CAST(:begins AS float8[]), CAST(:ends AS float8[])) WITH ORDINALITY "
    "AS w(b, e, i) "
    # A bound of its own, so that the index on released_at finds the rows.
    "JOIN (SELECT * FROM allocations WHERE released_at IS NULL "
    "OR released_at > to_timestamp(:earliest)) AS al "
    "ON (al.released_at IS NULL OR al.released_at > to_timestamp(w.b)) "
    "AND al.allocated_at < to_timestamp(w.e) "
    "JOIN jobs AS j ON j.id = al.job_id AND j.account = ANY(CAST(:accounts AS text[])) "
    "JOIN nodes AS n ON n.id = al.node_id "
    "GROUP BY w.i, j.account, j.user_name, al.units, n.name, j.partition")


def window_usage(session: Session, windows: Sequence[tuple[float, float]],
                 accounts: Iterable[str], now: float
                 ) -> dict[int, dict[tuple[str, str], float]]:
    """GPU-seconds (a share as its fraction) held within each of ``windows`` (begin,
    end; epoch seconds) by each (account, user) of ``accounts``, by the window's place."""
    wanted = sorted(set(accounts))
    used: dict[int, dict[tuple[str, str], float]] = defaultdict(lambda: defaultdict(float))
    if not windows or not wanted:
        return used
    rows = session.connection().execute(_USAGE, {
        "begins": [b for b, _ in windows], "ends": [e for _, e in windows],
        "earliest": min(b for b, _ in windows), "accounts": wanted, "now": now}).all()
    offers: ShareOffers | None = None
    for place, account, user, units, node, partition, seconds in rows:
        if units is not None and offers is None:
            offers = ShareOffers(session)
        offered = offers.of(units, node, partition) if offers is not None else None
        used[place - 1][(account, user)] += float(seconds or 0) * gpu_fraction(units, offered)
    return used


def _begin(period: str, now: float) -> float:
    start = period_start(period, now)
    return 0.0 if start is None else start


_MARGIN, _SETTLE, _RENEW = 120.0, 60.0, 6 * 3600.0  # seconds
Owners = dict[tuple[str, str], float]  # GPU-seconds by (account, user)


class _Kept:
    """Each period's usage up to a settled moment, by (database, accounts, period
    start): (settled moment, when it was read from the period's start, usage)."""

    def __init__(self, most: int = 64) -> None:
        self.lock = threading.Lock()
        self.most = most
        self.entries: dict[tuple[str, frozenset[str], float], tuple[float, float, Owners]] = {}

    def get(self, key: tuple[str, frozenset[str], float]) -> tuple[float, float, Owners] | None:
        with self.lock:
            return self.entries.get(key)

    def put(self, key: tuple[str, frozenset[str], float], value: tuple[float, float, Owners]) -> None:
        with self.lock:
            self.entries.pop(key, None)
            self.entries[key] = value
            while len(self.entries) > self.most:
                del self.entries[next(iter(self.entries))]


_KEPT = _Kept()


def period_usage(session: Session, starts: Sequence[float], wanted: frozenset[str],
                 now: float) -> dict[float, Owners]:
    """The usage since each of ``starts`` until ``now`` of the jobs of ``wanted``
    accounts, by (account, user): the kept part, extended to the settled moment, and
    the rest read now, in one statement."""
    settled = math.floor((now - _MARGIN) / _SETTLE) * _SETTLE
    database = str(session.connection().engine.url)
    windows: list[tuple[float, float]] = []
    extend: dict[float, tuple[float, Owners, int]] = {}  # start -> (read at, kept, window)
    for start in starts:
        if start >= settled:
            continue
        kept = _KEPT.get((database, wanted, start))
        if kept is None or kept[0] > settled or settled - kept[1] >= _RENEW:
            extend[start] = (settled, {}, len(windows))  # read from the period's start
            windows.append((start, settled))
        elif kept[0] == settled:
            extend[start] = (kept[1], kept[2], -1)  # as kept
        else:
            extend[start] = (kept[1], kept[2], len(windows))  # the minutes settled since
            windows.append((kept[0], settled))
    live = {max(start, settled) for start in starts}
    place = {begin: len(windows) + i for i, begin in enumerate(sorted(live))}
    windows.extend((begin, now) for begin in sorted(live))
    used = window_usage(session, windows, wanted, now)
    found: dict[float, Owners] = {}
    for start in starts:
        total: Owners = defaultdict(float)
        if start in extend:
            read_at, kept_usage, window = extend[start]
            settled_usage = dict(kept_usage)
            for owner, value in used.get(window, {}).items() if window >= 0 else ():
                settled_usage[owner] = settled_usage.get(owner, 0.0) + value
            if window >= 0:
                _KEPT.put((database, wanted, start), (settled, read_at, settled_usage))
            for owner, value in settled_usage.items():
                total[owner] += value
        for owner, value in used.get(place[max(start, settled)], {}).items():
            total[owner] += value
        found[start] = dict(total)
    return found


def usage_of(session: Session, found: Sequence[tuple[str, str | None, float, str]],
             accounts: Iterable[Account], now: float) -> tuple[Budget, ...]:
    """The budgets ``found`` (as ``budget_rows`` gives them) with what their current
    periods used as of ``now`` (``period_usage``)."""
    if not found:
        return ()
    parents = {a.name: a.parent for a in accounts}
    starts = sorted({_begin(period, now) for *_, period in found})
    used = period_usage(session, starts, covered_accounts(
        ((a, u) for a, u, *_ in found), parents), now)
    budgets = []
    for account, user, hours, period in found:
        by_owner = used[_begin(period, now)]
        seconds = sum(value for (job_account, job_user), value in by_owner.items()
                      if covers((account, user), job_user, job_account, parents))
        budgets.append(Budget(account, user, hours, period, seconds, now))
    return tuple(budgets)


def load_budgets(session: Session, accounts: Iterable[Account], now: float) -> tuple[Budget, ...]:
    """Every budget with its current period's usage (two statements; one without
    budgets)."""
    found = read_budgets(session)
    return usage_of(session, found, accounts, now)


def _iso(at: float | None) -> str | None:
    return None if at is None else datetime.fromtimestamp(at, UTC).isoformat()


def _hours(seconds: float) -> float:
    return round(seconds / 3600, 6)


def balance(snapshot: Snapshot, user: str | None, account: str | None) -> list[dict[str, Any]]:
    """What each budget a caller may see has used, what running jobs may still use, and
    what is left (``gpusched balance``): those covering ``user``'s jobs in their
    accounts (None: every user's), of ``account`` and the accounts above it (None:
    every account)."""
    book = BudgetBook(snapshot.budgets, snapshot.accounts, snapshot.running,
                      snapshot.nodes, snapshot.partitions)
    if user is not None:
        associations = [a.account for a in snapshot.user_shares if a.user == user
                        and (account is None or a.account == account)]
        keys = dict.fromkeys(key for a in associations for key in book.scope(user, a))
    elif account is not None:
        keys = dict.fromkeys((*(key for key in book.budgets
                                if key[1] is not None and key[0] == account),
                              *book.scope("", account)))
    else:
        keys = dict.fromkeys(book.budgets)
    rows = []
    for key in sorted(keys, key=lambda k: (k[0], k[1] or "")):
        budget = book.budgets[key]
        used, running, left = book.balance(key)
        start = period_start(budget.period, budget.as_of)
        rows.append({"account": budget.account, "user": budget.user, "period": budget.period,
                     "period_start": _iso(start),
                     "period_end": _iso(None if start is None
                                        else period_after(budget.period, start)),
                     "budget_gpu_hours": budget.gpu_hours, "used_gpu_hours": _hours(used),
                     "running_gpu_hours": _hours(running), "left_gpu_hours": _hours(left)})
    return rows


def report(session: Session, start: datetime, end: datetime,
           now: datetime) -> list[dict[str, Any]]:
    """Each budget's usage in each of its periods that overlap [start, end) (a period
    not over yet: until ``now``), as ``gacct --report`` shows it."""
    found = read_budgets(session)
    if not found:
        return []
    parents: Mapping[str, str | None] = {
        name: parent for name, parent in session.connection().execute(_TREE)}
    at = now.timestamp()
    windows: dict[tuple[float, float], int] = {}
    periods = []
    for account, user, hours, period in found:
        for begin, after in periods_between(period, start.timestamp(), end.timestamp()):
            window = (0.0 if begin is None else begin, at if after is None else min(after, at))
            if window[0] >= window[1]:
                continue
            periods.append((account, user, hours, period, begin, after,
                            windows.setdefault(window, len(windows))))
    used = window_usage(session, list(windows), covered_accounts(
        ((a, u) for a, u, *_ in found), parents), at)
    return [{"account": account, "user": user, "period": period, "period_start": _iso(begin),
             "period_end": _iso(after), "budget_gpu_hours": hours,
             "used_gpu_hours": _hours(sum(
                 value for (job_account, job_user), value in used.get(place, {}).items()
                 if covers((account, user), job_user, job_account, parents)))}
            for account, user, hours, period, begin, after, place in sorted(
                periods, key=lambda p: (p[0], p[1] or "", p[4] or 0.0))]
