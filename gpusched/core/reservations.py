"""Advance reservations (Slurm's ``scontrol create reservation``): what they hold, when,
and which jobs may use them.

A reservation holds whole nodes, or a count of GPUs on given nodes, from its start to its
end; DAILY and WEEKLY ones hold again at the same time every day or week. Jobs not in
it never start where they would run into it; jobs in it (``--reservation``) run only on
what it holds while it lasts (core/resvpass.py). Pure: times are POSIX seconds given by
the caller.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

INF = math.inf
DAY = 86_400.0
WEEK = 7 * DAY

MAINT = "MAINT"  # for maintenance: shown as such; may overlap other reservations
IGNORE_JOBS = "IGNORE_JOBS"  # made even though running jobs would still run at its start
DAILY = "DAILY"
WEEKLY = "WEEKLY"
FLEX = "FLEX"  # its jobs may also run outside it (other nodes, before or after it)
OVERLAP = "OVERLAP"  # may hold what another reservation holds at the same time
FLAGS = (MAINT, IGNORE_JOBS, DAILY, WEEKLY, FLEX, OVERLAP)

MAX_NAME = 64
MAX_NODES = 4096
MAX_NAMES = 1024  # users or accounts named by one reservation
MAX_SPAN = 10 * 366 * DAY  # a reservation lasts at most ten years
# How far ahead repeating reservations hold: jobs longer than this may meet a later one.
HORIZON = 5 * WEEK
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


class ReservationError(ValueError):
    """A reservation that cannot be: the message says why, for the user."""


@dataclass(frozen=True, slots=True)
class AdvanceReservation:
    """One reservation.

    ``holds`` names each node and the GPUs held there (0: the whole node: its GPUs, CPUs
    and memory). ``users`` and ``accounts`` say who may use it: names, or all but the
    names when each starts with ``-`` (Slurm's form); a job must satisfy both lists.
    """

    name: str
    start: float
    end: float
    holds: tuple[tuple[str, int], ...]
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    flags: frozenset[str] = frozenset()

    @property
    def period(self) -> float | None:
        """Seconds between two of its occurrences; None when it does not repeat."""
        if WEEKLY in self.flags:
            return WEEK
        if DAILY in self.flags:
            return DAY
        return None

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes it holds (some or all of)."""
        return tuple(node for node, _ in self.holds)

    @property
    def maint(self) -> bool:
        """Whether it is for maintenance."""
        return MAINT in self.flags

    @property
    def flex(self) -> bool:
        """Whether its jobs may run outside it too."""
        return FLEX in self.flags


def check_name(name: str) -> str:
    """A reservation name: letters, digits, ``_.-``, at most MAX_NAME characters."""
    if not name or len(name) > MAX_NAME or not _NAME.match(name):
        raise ReservationError(
            f"invalid reservation name {name[:MAX_NAME]!r}: expected 1 to {MAX_NAME} letters, "
            "digits, '_', '.' or '-', starting with a letter or digit")
    return name


def check_flags(flags: Iterable[str]) -> frozenset[str]:
    """The flags upper-cased, each one of FLAGS; DAILY and WEEKLY exclude each other."""
    found = frozenset(flag.strip().upper() for flag in flags if flag.strip())
    unknown = sorted(found - set(FLAGS))
    if unknown:
        raise ReservationError(f"unknown reservation flag {unknown[0]!r}: expected "
                               f"{', '.join(FLAGS)}")
    if DAILY in found and WEEKLY in found:
        raise ReservationError("flags DAILY and WEEKLY cannot both be given")
    return found


def check_names(kind: str, names: Iterable[str]) -> tuple[str, ...]:
    """Users or accounts: all plain, or all negated with ``-`` (never a mix)."""
    listed = tuple(dict.fromkeys(n.strip() for n in names if n.strip()))
    if len(listed) > MAX_NAMES:
        raise ReservationError(f"too many {kind}: at most {MAX_NAMES}")
    for name in listed:
        bare = name.removeprefix("-")
        if not bare or len(bare) > 64 or not _NAME.match(bare):
            raise ReservationError(f"invalid name {name[:64]!r} in {kind}")
    negated = {name.startswith("-") for name in listed}
    if len(negated) > 1:
        raise ReservationError(f"{kind}: either names or names each with '-' (all but "
                               "them), not both")
    return listed


def check_window(start: float, end: float, period: float | None) -> None:
    """A start before its end, lasting at most MAX_SPAN (a repeating one at most its period)."""
    if not end > start:
        raise ReservationError("a reservation must end after it starts")
    if end - start > MAX_SPAN:
        raise ReservationError("a reservation lasts at most ten years")
    if period is not None and end - start > period:
        raise ReservationError("a DAILY reservation lasts at most a day, a WEEKLY one a week")


def _listed(names: tuple[str, ...], name: str | None) -> bool:
    if not names:
        return True
    if names[0].startswith("-"):
        return name is None or ("-" + name) not in names
    return name is not None and name in names


def may_use(resv: AdvanceReservation, user: str, account: str | None) -> bool:
    """Whether a job of ``user`` under ``account`` may run in ``resv``."""
    if not resv.users and not resv.accounts:
        return False
    return _listed(resv.users, user) and _listed(resv.accounts, account)


def occurrences(resv: AdvanceReservation, after: float, until: float
                ) -> Iterator[tuple[float, float]]:
    """Each (start, end) of ``resv`` that ends after ``after`` and starts before
    ``until``, in order."""
    period, length = resv.period, resv.end - resv.start
    if period is None:
        if resv.end > after and resv.start < until:
            yield resv.start, resv.end
        return
    skip = max(0, math.floor((after - resv.end) / period) + 1) if after >= resv.end else 0
    start = resv.start + skip * period
    while start + length <= after:  # float rounding: never yield one already over
        start += period
    while start < until:
        yield start, start + length
        start += period


def active(resv: AdvanceReservation, now: float) -> tuple[float, float] | None:
    """The occurrence of ``resv`` going on at ``now``, if any."""
    for start, end in occurrences(resv, now, now + 1e-9):
        if start <= now < end:
            return start, end
    return None


def next_occurrence(resv: AdvanceReservation, now: float) -> tuple[float, float] | None:
    """The occurrence going on at ``now``, else the next one; None once it is over."""
    return next(occurrences(resv, now, INF), None)


def over(resv: AdvanceReservation, now: float) -> bool:
    """Whether ``resv`` holds nothing from ``now`` on."""
    return resv.period is None and resv.end <= now


def held_at(resv: AdvanceReservation, when: float) -> dict[str, int]:
    """What ``resv`` holds at ``when``: GPUs per node (0: the whole node); empty when
    it holds nothing then."""
    return dict(resv.holds) if active(resv, when) is not None else {}


def windows(resv: AdvanceReservation, now: float, horizon: float = HORIZON
            ) -> list[tuple[float, float]]:
    """The occurrences a pass at ``now`` holds resources for: every one that has not
    ended, up to ``horizon`` ahead for a repeating one (the first is cut to start now)."""
    until = INF if resv.period is None else now + horizon
    return [(max(start, now), end) for start, end in occurrences(resv, now, until)]


def overlapping(one: AdvanceReservation, other: AdvanceReservation, now: float) -> bool:
    """Whether ``one`` and ``other`` hold some node at the same time (from ``now`` on,
    within the horizon for repeating ones)."""
    if not set(one.nodes) & set(other.nodes):
        return False
    theirs = windows(other, now)
    return any(s < e2 and s2 < e for s, e in windows(one, now) for s2, e2 in theirs)


def may_overlap(one: AdvanceReservation, other: AdvanceReservation) -> bool:
    """Whether two reservations may hold the same node at once: when either is MAINT
    or OVERLAP (as Slurm)."""
    return bool((one.flags | other.flags) & {MAINT, OVERLAP})


def pick_holds(free_at_start: Mapping[str, int], whole: Mapping[str, bool],
               gpus: int | None, node_count: int | None) -> tuple[tuple[str, int], ...]:
    """Nodes for a reservation that names a count rather than nodes.

    ``free_at_start`` gives, per candidate node (in the order to prefer), the GPUs free
    for the whole reservation; ``whole`` whether the node is wholly free then. With
    ``node_count``, that many wholly free nodes, held whole (with ``gpus`` too: the
    nodes together have at least that many GPUs); else ``gpus`` GPUs, the nodes with most
    free first. Raises ReservationError when there are not enough.
    """
    if node_count is not None:
        chosen = [node for node in free_at_start if whole.get(node)][:node_count]
        if len(chosen) < node_count:
            raise ReservationError(f"only {len(chosen)} node(s) are free for the whole "
                                   f"reservation; {node_count} asked for")
        if gpus is not None and sum(free_at_start[n] for n in chosen) < gpus:
            raise ReservationError(f"{node_count} free node(s) hold fewer than {gpus} GPUs")
        return tuple((node, 0) for node in chosen)
    if gpus is None or gpus <= 0:
        raise ReservationError("a reservation needs nodes, a node count or a GPU count")
    holds: list[tuple[str, int]] = []
    left = gpus
    for node in sorted(free_at_start, key=lambda n: -free_at_start[n]):
        if left <= 0:
            break
        take = min(left, free_at_start[node])
        if take > 0:
            holds.append((node, take))
            left -= take
    if left > 0:
        raise ReservationError(f"only {gpus - left} GPU(s) are free for the whole "
                               f"reservation; {gpus} asked for")
    return tuple(sorted(holds))


def state_of(resv: AdvanceReservation, now: float) -> str:
    """ACTIVE while an occurrence goes on, else INACTIVE (as scontrol shows)."""
    return "ACTIVE" if active(resv, now) is not None else "INACTIVE"


def free_during(totals: Mapping[str, int], running: Iterable[tuple[str, int, float]],
                others: Iterable[AdvanceReservation], new: AdvanceReservation, now: float,
                ignore_jobs: bool = False) -> tuple[dict[str, int], dict[str, bool]]:
    """For a reservation being made (``new``, its holds not yet chosen): the GPUs of each
    node free for all of it, and whether the node is wholly free then.

    ``totals`` gives each node's GPUs; ``running`` each running job's (node, GPUs, end:
    INF without a time limit), in the way when it ends after ``new`` starts (unless
    ``ignore_jobs``); ``others`` the reservations it may not overlap on a node.
    """
    first = next_occurrence(new, now)
    begins = INF if first is None else first[0]
    free = dict(totals)
    whole = {node: True for node in totals}
    if not ignore_jobs:
        for node, gpus, end in running:
            if node in free and end > begins:
                free[node] -= gpus
                whole[node] = False
    probe = AdvanceReservation(new.name, new.start, new.end, tuple((n, 0) for n in totals),
                               new.users, new.accounts, new.flags)
    for other in others:
        if may_overlap(other, new) or not overlapping(probe, other, now):
            continue
        for node, gpus in other.holds:
            if node in free:
                free[node] -= totals[node] if gpus == 0 else gpus
                whole[node] = False
    return {node: max(0, count) for node, count in free.items()}, whole
