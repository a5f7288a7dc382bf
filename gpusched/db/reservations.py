"""Advance reservations in the database: the table, making, changing and removing them
(``gcontrol create|update|delete reservation``), what a pass reads of them, and the
check of a job that asks for one (``--reservation``).

A reservation that names a count (``gpus``, ``node_count``) is given its nodes when made
(core/reservations.py: ``pick_holds``), among the nodes free for all of it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import CheckConstraint, DateTime, Integer, Text, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, Session, mapped_column

from gpusched.core.hostlist import compress_hostlist
from gpusched.core.model import Snapshot
from gpusched.core.reservations import (
    DAILY,
    IGNORE_JOBS,
    INF,
    WEEKLY,
    AdvanceReservation,
    ReservationError,
    active,
    check_window,
    free_during,
    may_overlap,
    may_use,
    next_occurrence,
    over,
    overlapping,
    pick_holds,
    state_of,
)
from gpusched.db.modelbase import Base
from gpusched.errors import Conflict, NotFound, UsageError
from gpusched.messages.reservations import ReservationRequest


class AdvanceReservationRow(Base):
    """An advance reservation (migration 0026): its window, what it holds, who may use it."""

    __tablename__ = "advance_reservations"
    __table_args__ = (
        CheckConstraint("char_length(name) BETWEEN 1 AND 64", name="name"),
        CheckConstraint("end_time > start_time", name="window"),
        CheckConstraint("cardinality(nodes) BETWEEN 1 AND 4096 "
                        "AND cardinality(node_gpus) = cardinality(nodes)", name="holds"),
    )

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    start_time: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    end_time: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    nodes: Mapped[list[str]] = mapped_column(ARRAY(Text))
    node_gpus: Mapped[list[int]] = mapped_column(ARRAY(Integer))  # 0: the whole node
    users: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))
    accounts: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))
    flags: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                 server_default=text("now()"))


_READ = text(
    "SELECT name, extract(epoch FROM start_time), extract(epoch FROM end_time), nodes, "
    "node_gpus, users, accounts, flags FROM advance_reservations ORDER BY name")
# The pending and running jobs that ask for a reservation (the partial index's rows).
_JOBS_IN = text(
    "SELECT id, state, reservation FROM jobs "
    "WHERE reservation IS NOT NULL AND state IN ('PENDING', 'RUNNING')")
_NODE_GPUS = text(
    "SELECT n.name, count(g.id) FILTER (WHERE g.parent_id IS NULL AND g.present) "
    "FROM nodes AS n LEFT JOIN gpus AS g ON g.node_id = n.id GROUP BY n.name ORDER BY n.name")
# Each running job's GPUs on each of its nodes (0 for a job holding none there), and
# when its time limit ends it (NULL: never); not the jobs of the reservation itself.
_RUNNING = text(
    "SELECT j.id, n.name, count(a.gpu_id), "
    "extract(epoch FROM j.start_time) + j.time_limit FROM jobs AS j "
    "JOIN nodes AS n ON n.name = ANY(coalesce(j.node_names, ARRAY[]::text[])) "
    "OR n.id = j.node_id "
    "LEFT JOIN allocations AS a ON a.job_id = j.id AND a.node_id = n.id "
    "AND a.released_at IS NULL WHERE j.state = 'RUNNING' "
    "AND j.reservation IS DISTINCT FROM :name GROUP BY j.id, n.name")
_USING = text("SELECT count(*) FROM jobs WHERE reservation = :name "
              "AND state IN ('PENDING', 'RUNNING')")
# Two reservations made at once must not both find the same nodes free: the writers
# take turns (readers, the pass among them, are not held up).
_WRITERS_ONE_AT_A_TIME = text("LOCK TABLE advance_reservations IN SHARE ROW EXCLUSIVE MODE")
_PARTITION_NODES = text("SELECT nodes FROM partitions WHERE name = :name")


def _core(row: Iterable[Any]) -> AdvanceReservation:
    name, start, end, nodes, gpus, users, accounts, flags = row
    return AdvanceReservation(name, float(start), float(end), tuple(zip(nodes, gpus)),
                              tuple(users), tuple(accounts), frozenset(flags))


def read_reservations(session: Session) -> tuple[AdvanceReservation, ...]:
    """Every reservation, by name."""
    return tuple(_core(row) for row in session.connection().execute(_READ))


def with_reservations(session: Session, snapshot: Snapshot,
                      reservations: tuple[AdvanceReservation, ...]) -> Snapshot:
    """``snapshot`` with the reservations and each pending and running job's
    reservation filled in (one query, made only while there are reservations: one is
    never removed while jobs ask for it)."""
    snapshot = replace(snapshot, advance_reservations=reservations)
    asked = {job_id: (state, name) for job_id, state, name in
             session.connection().execute(_JOBS_IN)}
    if not asked:
        return snapshot

    def named(job: Any, state: str) -> Any:
        found = asked.get(job.job_id)
        return replace(job, reservation=found[1]) if found and found[0] == state else job

    return replace(snapshot, pending=tuple(named(j, "PENDING") for j in snapshot.pending),
                   running=tuple(named(j, "RUNNING") for j in snapshot.running))


def check_reservation(session: Session, name: str | None, user: str,
                      account: str | None, partition: tuple[str, list[str]] | None = None
                      ) -> None:
    """Refuse a submission naming a reservation that does not exist, is over, does not
    let its user and account in (as sbatch refuses them), or holds no node of its
    ``partition`` (name, nodes: ``*`` for every node)."""
    if name is None:
        return
    found = session.get(AdvanceReservationRow, name)
    resv = None if found is None else _core(_row_of(found))
    if resv is None or over(resv, time.time()):
        raise UsageError(f"reservation {name}: no such reservation (or it is over)")
    if not may_use(resv, user, account):
        raise UsageError(f"reservation {name}: access denied to user {user} "
                         f"(account {account or '-'})")
    if partition is not None and "*" not in partition[1] \
            and not set(resv.nodes) & set(partition[1]):
        raise UsageError(f"reservation {name} holds no node of partition {partition[0]}")


def _row_of(found: AdvanceReservationRow) -> tuple[Any, ...]:
    return (found.name, found.start_time.timestamp(), found.end_time.timestamp(),
            found.nodes, found.node_gpus, found.users, found.accounts, found.flags)


def _window(request: ReservationRequest, now: float,
            known: AdvanceReservation | None) -> tuple[float, float]:
    start = request.start if request.start is not None else (
        known.start if known is not None else now)
    if request.end is not None:
        end = request.end
    elif request.duration is not None:
        end = start + request.duration
    elif known is not None:
        end = start + (known.end - known.start)
    else:
        raise UsageError("a reservation needs an end or a duration")
    return start, end


def _holds(session: Session, request: ReservationRequest, draft: AdvanceReservation,
           others: list[AdvanceReservation], now: float) -> tuple[tuple[str, int], ...]:
    """What a reservation being made holds: the nodes named (checked free for all of it
    unless IGNORE_JOBS), or the count asked for, picked among the free ones."""
    conn = session.connection()
    totals = {name: count for name, count in conn.execute(_NODE_GPUS)}
    running = [(node, gpus, INF if end is None else float(end))
               for _, node, gpus, end in conn.execute(_RUNNING, {"name": draft.name})]
    named = request.nodes
    if named is not None and [n.upper() for n in named] == ["ALL"]:
        named = tuple(totals)
    if named is not None:
        unknown = sorted(set(named) - set(totals))
        if unknown:
            raise NotFound(f"no node named {unknown[0]}")
        candidates = {n: totals[n] for n in sorted(set(named))}
    else:
        members = (None if request.partition is None
                   else conn.execute(_PARTITION_NODES, {"name": request.partition}).scalar())
        if request.partition is not None and members is None:
            raise NotFound(f"no partition named {request.partition}")
        everywhere = members is None or "*" in members
        candidates = {n: c for n, c in totals.items() if everywhere or n in (members or ())}
    free, whole = free_during(candidates, running, others, draft, now,
                              IGNORE_JOBS in draft.flags)
    try:
        if named is not None and request.gpus is None and request.node_count is None:
            busy = sorted(n for n in candidates if not whole[n])
            if busy:
                raise ReservationError(
                    f"requested nodes are busy: {compress_hostlist(busy)} run jobs past its "
                    "start or are held by another reservation then (flags IGNORE_JOBS, "
                    "OVERLAP or MAINT allow it)")
            return tuple((n, 0) for n in candidates)
        return pick_holds(free, whole, request.gpus, request.node_count)
    except ReservationError as exc:
        raise Conflict(str(exc)) from None


def _checked_window(start: float, end: float, flags: frozenset[str], now: float) -> None:
    period = 604_800.0 if WEEKLY in flags else 86_400.0 if DAILY in flags else None
    try:
        check_window(start, end, period)
    except ReservationError as exc:
        raise UsageError(str(exc)) from None
    if period is None and end <= now:
        raise UsageError("the reservation would be over already: its end is in the past")


def create_reservation(session: Session, request: ReservationRequest,
                       now: float | None = None) -> dict[str, Any]:
    """Make a reservation; its JSON. UsageError, NotFound or Conflict say why not."""
    now = time.time() if now is None else now
    if request.name is None:
        raise UsageError("a reservation needs a name")
    if request.users is None and request.accounts is None:
        raise UsageError("a reservation needs users or accounts (who may use it)")
    if request.nodes is None and request.gpus is None and request.node_count is None:
        raise UsageError("a reservation needs nodes, a node count or a GPU count")
    session.execute(_WRITERS_ONE_AT_A_TIME)
    _drop_ended(session, now)
    if session.get(AdvanceReservationRow, request.name) is not None:
        raise Conflict(f"reservation {request.name} exists already")
    flags = request.flags or frozenset()
    start, end = _window(request, now, None)
    _checked_window(start, end, flags, now)
    draft = AdvanceReservation(request.name, start, end, (), request.users or (),
                               request.accounts or (), flags)
    others = [r for r in read_reservations(session) if not over(r, now)]
    holds = _holds(session, request, draft, others, now)
    resv = replace(draft, holds=holds)
    _refuse_overlap(resv, others, now)
    session.add(AdvanceReservationRow(
        name=resv.name, start_time=_utc(start), end_time=_utc(end),
        nodes=[n for n, _ in holds], node_gpus=[g for _, g in holds], users=list(resv.users),
        accounts=list(resv.accounts), flags=sorted(flags)))
    session.flush()
    return reservation_json(resv, now)


def _refuse_overlap(resv: AdvanceReservation, others: Iterable[AdvanceReservation],
                    now: float) -> None:
    for other in others:
        if other.name != resv.name and not may_overlap(resv, other) \
                and overlapping(resv, other, now):
            shared = sorted(set(resv.nodes) & set(other.nodes))
            raise Conflict(f"nodes {compress_hostlist(shared)} are held by reservation "
                           f"{other.name} at that time (flags OVERLAP or MAINT allow it)")


def update_reservation(session: Session, name: str, request: ReservationRequest,
                       now: float | None = None) -> dict[str, Any]:
    """Change a reservation's window, users, accounts, flags or what it holds; its JSON."""
    now = time.time() if now is None else now
    session.execute(_WRITERS_ONE_AT_A_TIME)
    found = session.get(AdvanceReservationRow, name, with_for_update=True)
    if found is None:
        raise NotFound(f"no reservation named {name}")
    if request.name is not None and request.name != name:
        raise UsageError("a reservation's name cannot be changed")
    known = _core(_row_of(found))
    flags = known.flags if request.flags is None else request.flags
    start, end = _window(request, now, known)
    if request.start is not None and request.end is None and request.duration is None:
        end = start + (known.end - known.start)
    _checked_window(start, end, flags, now)
    resv = replace(known, start=start, end=end, flags=flags,
                   users=known.users if request.users is None else request.users,
                   accounts=known.accounts if request.accounts is None else request.accounts)
    if not resv.users and not resv.accounts:
        raise UsageError("a reservation needs users or accounts (who may use it)")
    others = [r for r in read_reservations(session) if r.name != name and not over(r, now)]
    if request.nodes is not None or request.gpus is not None or request.node_count is not None:
        resv = replace(resv, holds=_holds(session, request, replace(resv, holds=()),
                                          others, now))
    _refuse_overlap(resv, others, now)
    found.start_time, found.end_time = _utc(resv.start), _utc(resv.end)
    found.nodes, found.node_gpus = [n for n, _ in resv.holds], [g for _, g in resv.holds]
    found.users, found.accounts, found.flags = (list(resv.users), list(resv.accounts),
                                                sorted(resv.flags))
    session.flush()
    return reservation_json(resv, now)


def delete_reservation(session: Session, name: str) -> None:
    """Remove a reservation no pending or running job asks for."""
    found = session.get(AdvanceReservationRow, name, with_for_update=True)
    if found is None:
        raise NotFound(f"no reservation named {name}")
    using = session.execute(_USING, {"name": name}).scalar_one()
    if using:
        raise Conflict(f"reservation {name} is in use by {using} pending or running job(s): "
                       "cancel them or let them end first")
    session.delete(found)
    session.flush()


def _drop_ended(session: Session, now: float) -> None:
    """Forget reservations that are over (as Slurm removes them at their end), once no
    pending or running job asks for them."""
    session.execute(text(
        "DELETE FROM advance_reservations AS r WHERE end_time <= to_timestamp(:now) "
        "AND NOT flags && ARRAY['DAILY', 'WEEKLY'] AND NOT EXISTS (SELECT 1 FROM jobs "
        "WHERE reservation = r.name AND state IN ('PENDING', 'RUNNING'))"), {"now": now})


def list_reservations(session: Session, name: str | None = None,
                      now: float | None = None) -> list[dict[str, Any]]:
    """Every reservation not over (or the one named: NotFound if there is none)."""
    now = time.time() if now is None else now
    found = [r for r in read_reservations(session) if not over(r, now)
             and (name is None or r.name == name)]
    if name is not None and not found:
        raise NotFound(f"no reservation named {name}")
    return [reservation_json(r, now) for r in found]


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _iso(seconds: float) -> str:
    return _utc(seconds).isoformat()


def reservation_json(resv: AdvanceReservation, now: float) -> dict[str, Any]:
    """A reservation as the API shows it: its next (or current) occurrence's times."""
    upcoming = next_occurrence(resv, now) or (resv.start, resv.end)
    whole = [n for n, g in resv.holds if g == 0]
    return {
        "name": resv.name, "state": state_of(resv, now),
        "start": _iso(upcoming[0]), "end": _iso(upcoming[1]),
        "duration": int(resv.end - resv.start),
        "nodes": list(resv.nodes), "node_list": compress_hostlist(resv.nodes),
        "node_count": len(resv.holds),
        "gpus": {n: g for n, g in resv.holds if g} or None,
        "whole_nodes": len(whole) == len(resv.holds),
        "users": list(resv.users), "accounts": list(resv.accounts),
        "flags": sorted(resv.flags),
    }


def node_reservations(session: Session, now: float | None = None) -> dict[str, str]:
    """The reservation going on that holds each node (a MAINT one first), by node name."""
    now = time.time() if now is None else now
    held: dict[str, str] = {}
    for resv in sorted(read_reservations(session), key=lambda r: (not r.maint, r.name)):
        if active(resv, now) is not None:
            for node in resv.nodes:
                held.setdefault(node, resv.name)
    return held
