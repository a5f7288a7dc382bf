"""Conservative backfill over interchangeable nodes: pools of 1-unit nodes whose
reservations count units, as the textbook's profile does, instead of holding named nodes.

On nodes of one unit each (N nodes x 1 GPU), which node a reservation holds is a choice
that can shut out a later job although enough units are free at every moment: holding
named nodes early is what makes per-node reservations start jobs later than the profile
says they could. A pool holds each reservation as a count over its interval in a
``Profile`` and names nodes only when a job starts (or when a plan must name them).

Why naming can wait: every node of a pool is free from some time on (when what runs or
was started there ends), and reservations are intervals. Taken in order of start, an
interval finds enough nodes free at its start whenever the profile says the units are
free then, and a node free at that start stays free for good, since no interval taken
so far starts later (interval scheduling on identical machines). So the profile alone
decides, and any choice of the nodes free now for a start keeps every reservation whole.

A request joins a pool when it asks for one whole unit per node, no CPUs or memory, not
whole nodes, and the nodes it may use are exactly the pool's. Everything else is planned
per node. Such a job may use a pool's nodes only after the pool's last reservation ends
(the pool's nodes are held against it until then) and its own reservation there is then
held on named nodes: a pin. With pins in a pool, a time the profile allows is kept only
if the same greedy assignment, which now avoids the pins, still finds nodes for every
interval; otherwise the next time is tried.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpusched.core.model import PendingJob, Reservation
from gpusched.core.profile import Profile
from gpusched.core.units import INF, Shape

if TYPE_CHECKING:
    from gpusched.core.capacity import Capacity

# (start, end, units, order made): a reservation held as a count.
Interval = tuple[float, float, int, int]


class UnitPool:
    """The 1-unit nodes of one kind, and what conservative backfill holds on them."""

    def __init__(self, capacity: Capacity, kind: str, nodes: list[int]) -> None:
        self.capacity, self.kind, self.nodes = capacity, kind, nodes
        self.members = frozenset(nodes)
        self.free_from = {index: self._free_from(index) for index in nodes}
        self.profile = Profile(capacity.now, 0, self.free_from.values())
        self.intervals: list[Interval] = []
        self.owners: dict[int, tuple[int, int]] = {}  # order made -> (job, plan position)
        self.pins: dict[int, list[tuple[float, float]]] = {}  # node -> held for a job there
        self.horizon = capacity.now  # when the last interval ends
        self.horizon_job = 0
        self.fenced = capacity.now  # the pool's nodes are held against others until then
        self.holds: dict[int, tuple[float, float, str, int, float, float]] = {}

    def _free_from(self, index: int) -> float:
        """When node ``index``'s unit is free of what runs or was started there."""
        node = self.capacity.nodes[index]
        if node.count(self.kind):
            return self.capacity.now
        return min((t for t, kind, gpus, *_ in node.releases if kind == self.kind and gpus),
                   default=INF)

    def refresh(self, index: int) -> None:
        """Node ``index`` changed (a start, an early release): follow it in the profile."""
        old, new = self.free_from[index], self._free_from(index)
        if new < old:
            self.profile.add(new, old, 1)
        elif new > old:
            self.profile.add(old, new, -1)
        self.free_from[index] = new

    # -- pool requests ------------------------------------------------------------------
    def earliest(self, shape: Shape, check: bool = True) -> float:
        """When ``shape`` (one unit on each of ``shape.nodes`` nodes) could start at the
        earliest, around every reservation; INF if never. ``check``: also keep the pins
        (an estimate may leave that out)."""
        units, length, after = shape.nodes, shape.duration, self.capacity.now
        if units > len(self.nodes):
            return INF
        while True:
            at = self.profile.earliest(units, length, after)
            if at == INF or not self.pins or not check:
                return at
            if self._assign((at, at + length, units, len(self.owners))) is not None:
                return at
            after = self.profile.next_after(at)
            if after == INF:
                return INF

    def place_now(self, shape: Shape) -> list[tuple[int, str]] | None:
        """The nodes to start ``shape`` on now, if the profile has room for its whole time
        limit now; else None."""
        now = self.capacity.now
        if self.earliest(shape) != now:
            return None
        nodes = self.capacity.nodes
        if self.pins:
            chosen = self._assign((now, now + shape.duration, shape.nodes, len(self.owners)))
            if chosen is None:  # cannot happen: ``earliest`` just assigned it
                return None
            if not all(nodes[index].count(self.kind) for index in chosen[-1]):
                return None  # a job past its limit holds one: due to end, not ended
            return [(index, self.kind) for index in chosen[-1]]
        # A node whose job ran past its time limit counts as free from now in the profile
        # (it is due to end), but nothing may start there until it has ended.
        free = [(index, self.kind) for index in self.nodes
                if self.free_from[index] <= now and nodes[index].count(self.kind)]
        if len(free) < shape.nodes:
            return None
        return self.capacity._same_block(free, shape.nodes)

    def reserve(self, at: float, shape: Shape, job_id: int, position: int) -> None:
        """Hold ``shape.nodes`` units from ``at`` for ``job_id`` (the ``position``-th
        reservation of the plan)."""
        end = at + shape.duration
        self.intervals.append((at, end, shape.nodes, len(self.owners)))
        self.owners[len(self.owners)] = (job_id, position)
        self.profile.add(at, end, -shape.nodes)
        if end > self.horizon:
            self.horizon, self.horizon_job = end, job_id

    # -- other requests on the pool's nodes ----------------------------------------------
    def pin(self, index: int, start: float, end: float) -> None:
        """A job planned per node holds node ``index`` over ``[start, end)``."""
        self.pins.setdefault(index, []).append((start, end))
        self.profile.add(start, end, -1)

    # -- naming nodes -------------------------------------------------------------------
    def _assign(self, extra: Interval | None = None) -> list[list[int]] | None:
        """Nodes for every interval (and ``extra``), taken in order of start (then of
        making), each on nodes free at its start; None if one finds too few. Without
        pins the nodes free longest are taken; with pins, among nodes free for the whole
        interval, those whose next pin comes soonest (the tightest fit)."""
        intervals = sorted(self.intervals + ([extra] if extra else []),
                           key=lambda i: (i[0], i[3]))
        order = {i[3]: n for n, i in enumerate(intervals)}
        chosen: list[list[int]] = [[] for _ in intervals]
        if not self.pins:
            ready = [(t, index) for index, t in self.free_from.items()]
            heapq.heapify(ready)
            for n, (start, end, units, _) in enumerate(intervals):
                while len(chosen[n]) < units:
                    if not ready or ready[0][0] > start:
                        return None
                    chosen[n].append(heapq.heappop(ready)[1])
                for index in chosen[n]:
                    heapq.heappush(ready, (end, index))
        else:
            free_from = dict(self.free_from)
            for n, (start, end, units, _) in enumerate(intervals):
                fits = []
                for index in self.nodes:
                    if free_from[index] > start:
                        continue
                    pins = self.pins.get(index, ())
                    if any(a < end and start < b for a, b in pins):
                        continue
                    fits.append((min((a for a, _ in pins if a >= end), default=INF), index))
                if len(fits) < units:
                    return None
                chosen[n] = [index for _, index in sorted(fits)[:units]]
                for index in chosen[n]:
                    free_from[index] = end
        by_made = [chosen[order[i[3]]] for i in self.intervals]
        if extra is not None:
            by_made.append(chosen[order[extra[3]]])
        return by_made

    def named(self) -> Iterable[tuple[int, list[int]]]:
        """(plan position, nodes) of every reservation held in this pool."""
        assigned = self._assign()
        for (_, _, _, made), nodes in zip(self.intervals, assigned or [], strict=False):
            yield self.owners[made][1], nodes


class UnitPools:
    """The pools of a conservative pass, and how its jobs use them."""

    def __init__(self, capacity: Capacity) -> None:
        self.capacity = capacity
        by_kind: dict[str, list[int]] = {}
        for node in capacity.nodes:  # an advance reservation's node: planned per node
            if node.view.run_uid is None and len(node.total) == 1 \
                    and next(iter(node.total.values())) == 1 \
                    and node.index not in capacity.reserved_nodes:
                by_kind.setdefault(next(iter(node.total)), []).append(node.index)
        self.pools = [UnitPool(capacity, kind, nodes) for kind, nodes in sorted(by_kind.items())]
        self.of_node = {index: pool for pool in self.pools for index in pool.nodes}
        self._for: dict[tuple[object, tuple[str, ...]], UnitPool | None] = {}

    def pool_for(self, job: PendingJob, members: frozenset[int], group: object
                 ) -> UnitPool | None:
        """The pool ``job`` is planned in, or None when it is planned per node."""
        if not self.pools or job.gpus != 1 or job.cpus or job.mem_mb or job.exclusive:
            return None
        key = (group, job.gpu_kinds)
        if key not in self._for:
            nodes = self.capacity.nodes
            kinds = self.capacity.matching(job.gpu_kinds)
            usable = {index for index in members
                      if any(nodes[index].total.get(kind, 0) for kind in kinds)}
            pool = self.of_node.get(min(usable)) if usable else None
            self._for[key] = pool if pool is not None and usable == pool.members else None
        return self._for[key]

    def fence(self) -> None:
        """Before a job planned per node: hold every pool's nodes against it until the
        pool's last reservation ends."""
        for pool in self.pools:
            if pool.horizon > pool.fenced:
                self.capacity.hold_for_pool(pool.nodes, pool.kind, pool.horizon,
                                            pool.horizon_job, pool.holds)
                pool.fenced = pool.horizon

    def started(self, where: Iterable[tuple[int, str]]) -> None:
        """A job started (or resources came back early) on these nodes."""
        for index, _ in where:
            pool = self.of_node.get(index)
            if pool is not None:
                pool.refresh(index)

    def reserved(self, where: Iterable[tuple[int, str]], at: float, shape: Shape) -> None:
        """A job planned per node holds these nodes from ``at``."""
        for index, _ in where:
            pool = self.of_node.get(index)
            if pool is not None:
                pool.pin(index, at, at + shape.duration)

    def name(self, reservations: list[Reservation]) -> None:
        """Give the pools' reservations in ``reservations`` the nodes they would hold."""
        nodes = self.capacity.nodes
        for pool in self.pools:
            if pool.intervals:
                for position, chosen in pool.named():
                    held = reservations[position]
                    reservations[position] = Reservation(
                        held.job_id, held.start_time,
                        tuple(nodes[index].view.name for index in sorted(chosen)))
