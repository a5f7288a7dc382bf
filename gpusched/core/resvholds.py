"""What advance reservations hold in a pass: time windows on nodes, against every job
the pass places, as the reservations backfill makes for blocked jobs do.

A reservation's window on a node is put into the pass's timeline (``Capacity.reserve``)
before any job is looked at: starting a job now must then leave it whole for the job's
whole time limit, and a blocked job's earliest start falls outside it. The jobs that run
in a reservation are placed by a pass of their own (core/resvpass.py), in which its
windows are not held.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from gpusched.core.capacity import Capacity
from gpusched.core.model import PendingJob, Reason, RunningJob, Snapshot
from gpusched.core.reservations import AdvanceReservation, windows
from gpusched.core.units import INF, Shape


def owner_of(position: int) -> int:
    """The owner a reservation's windows get in the timeline (backfill's are job ids,
    all positive): minus one minus its place in the snapshot's list."""
    return -1 - position


def main_kind(totals: dict[str, int], slices: set[str]) -> str | None:
    """The kind of whole GPU a GPU-count hold counts on a node: the one it has most of."""
    whole = [(count, kind) for kind, count in totals.items() if kind not in slices]
    return max(whole)[1] if whole else None


def _used_by(running: Sequence[RunningJob], name: str, capacity: Capacity, index: int,
             kind: str) -> Iterator[tuple[float, int]]:
    """(end, GPUs of ``kind`` on node ``index``) of each running job of reservation ``name``."""
    for job in running:
        if job.reservation != name:
            continue
        count = sum(1 for uuid in job.gpu_uuids if capacity.kind_of.get(uuid) == (index, kind))
        if count:
            yield (INF if job.end_time is None else job.end_time), count


def hold_reservations(capacity: Capacity, snapshot: Snapshot, now: float
                      ) -> dict[int, list[tuple[float, float]]]:
    """Put every window of the snapshot's reservations into ``capacity``; the windows
    that hold each node whole, by node.

    A whole node is held whole: every unit of each kind, its CPUs and memory. A count
    of GPUs is held on the node's main kind; while a window goes on, the GPUs its own
    running jobs hold count towards it until they end (they are in the timeline already).
    """
    whole: dict[int, list[tuple[float, float]]] = {}
    for position, resv in enumerate(snapshot.advance_reservations):
        spans = windows(resv, now)
        if not spans:
            continue
        owner = owner_of(position)
        for name, gpus in resv.holds:
            index = capacity.index.get(name)
            if index is None:
                continue  # down, drained or gone: nothing to hold
            node = capacity.nodes[index]
            for start, end in spans:
                if gpus == 0:
                    _hold_whole_node(capacity, index, start, end, owner)
                    whole.setdefault(index, []).append((start, end))
                    continue
                kind = main_kind(node.total, node.slices)
                if kind is None:
                    continue
                held = min(gpus, node.total[kind])
                if start <= now:
                    for ends, count in _used_by(snapshot.running, resv.name, capacity,
                                                index, kind):
                        held -= count
                        if ends < end:  # back to the reservation once it ends
                            _hold(capacity, index, kind, count, 0, 0, ends, end, owner)
                if held > 0:
                    _hold(capacity, index, kind, held, 0, 0, start, end, owner)
    return whole


def _hold_whole_node(capacity: Capacity, index: int, start: float, end: float,
                     owner: int) -> None:
    node = capacity.nodes[index]
    cpus, mem = node.view.cpus, node.view.memory_mb
    kinds = list(node.total.items()) or [("", 0)]
    for kind, count in kinds:
        _hold(capacity, index, kind, count, cpus, mem, start, end, owner)
        cpus = mem = 0  # once per node


def _hold(capacity: Capacity, index: int, kind: str, gpus: int, cpus: int, mem: int,
          start: float, end: float, owner: int) -> None:
    shape = Shape((), gpus, cpus, mem, 1, end - start, 0)
    capacity.reserve(start, [(index, kind)], shape, owner)


class ReservationHooksMixin:
    """What a scheduling pass does about advance reservations (used by core/plan.py)."""

    snapshot: Snapshot
    now: float
    capacity: Capacity
    # Node index -> the windows that hold it whole (for jobs that ask for nothing).
    whole_held: dict[int, list[tuple[float, float]]]

    def _hold_reservations(self) -> None:
        """Hold the snapshot's reservations in this pass's timeline, if it has any."""
        self.whole_held = (hold_reservations(self.capacity, self.snapshot, self.now)
                           if self.snapshot.advance_reservations else {})

    def _off_holds(self, job: PendingJob, members: frozenset[int]) -> frozenset[int]:
        """``members`` less the nodes a reservation holds whole while ``job`` would run:
        a job that asks for no GPU, CPU or memory fits anywhere as far as counts go, and
        must still not run into a reservation."""
        end = self.now + (INF if job.time_limit is None else job.time_limit)
        return frozenset(i for i in members if not any(
            start < end and self.now < stop for start, stop in self.whole_held.get(i, ())))

    def _resources_reason(self, job: PendingJob, shape: Shape,
                          members: frozenset[int]) -> Reason:
        """Resources, or ReqNodeNotAvail when a node has room for the job now and only a
        reservation's window keeps it off (Slurm's reason for nodes reserved)."""
        if self.snapshot.advance_reservations and not job.exclusive:
            if not (job.gpus or job.cpus or job.mem_mb):
                return Reason.REQ_NODE_NOT_AVAIL  # only a window keeps such a job off
            found = self.capacity.in_the_way(shape, members)
            if found is not None and found[1] < 0:
                return Reason.REQ_NODE_NOT_AVAIL
        return Reason.RESOURCES


def reservation_at(reservations: Sequence[AdvanceReservation], node: str,
                   start: float, now: float) -> AdvanceReservation | None:
    """The reservation holding ``node`` from ``start`` (as ``windows`` gives it)."""
    for resv in reservations:
        if node in resv.nodes and any(abs(s - start) < 1e-6 for s, _ in windows(resv, now)):
            return resv
    return None


def _when(at: float) -> str:
    from datetime import UTC, datetime
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def reservation_detail(reason: Reason, job: PendingJob, in_the_way: tuple[str, int, float] | None,
                       snapshot: Snapshot, now: float) -> str:
    """--explain's sentence for Reservation or ReqNodeNotAvail."""
    from gpusched.core.reservations import active, may_use, next_occurrence
    if reason is Reason.REQ_NODE_NOT_AVAIL:
        if in_the_way is None:
            return "the nodes it may use are held by an advance reservation"
        node, _, start = in_the_way
        resv = reservation_at(snapshot.advance_reservations, node, start, now)
        what = (f"reservation {resv.name}{' (maintenance)' if resv.maint else ''}"
                if resv is not None else "an advance reservation")
        return (f"{node} has room for it now, but its time limit would run into {what} "
                f"from {_when(start)}: it starts when the reservation is over, or now "
                "with a time limit that ends before it")
    name = job.reservation or ""
    resv = next((r for r in snapshot.advance_reservations if r.name == name), None)
    if resv is None:
        return (f"reservation {name} no longer exists: it will stay pending; cancel it "
                f"(gcancel {job.job_id})")
    if not may_use(resv, job.user, job.account):
        return (f"reservation {name} does not let user {job.user} (account "
                f"{job.account or '-'}) in: it will stay pending")
    window = active(resv, now)
    if window is None:
        upcoming = next_occurrence(resv, now)
        return ("it runs only in reservation " + name + (
            f", which begins {_when(upcoming[0])}" if upcoming else ", which is over"))
    if window[1] - now < 60:
        return (f"less than a minute of reservation {name} is left (it ends "
                f"{_when(window[1])}): it starts when the reservation next begins, if it does")
    return f"it runs only on what reservation {name} holds"
