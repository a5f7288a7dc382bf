"""The timeline: when a job that cannot start now could start at the earliest, where to
hold resources for it then, and the reservations that hold them.

Each node's own timeline is a ``NodeTimeline``; this part sorts the nodes by when a
shape could start on them, keeping the sorted lists between calls and refreshing only
the nodes a start or a reservation changed since.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from gpusched.core.kept_starts import as_of
from gpusched.core.node_profile import NodeProfile
from gpusched.core.resources import PassResources
from gpusched.core.start_order import StartOrder
from gpusched.core.units import INF, Shape


class TimelineMixin(PassResources):
    """Earliest starts, estimates and reservations for jobs that must wait."""

    def _start_order(self, kind: str, shape: Shape, reserved: bool) -> StartOrder:
        """The nodes on the wanted side of the reservations (``reserved`` or not) that
        have enough units of ``kind``, in order of when ``shape`` could start there.

        A node without a reservation only gains resources as time goes on, so when a
        shape could start there does not depend on how long it runs: one order serves
        every job of the same size.
        """
        key = (reserved, kind, shape.gpus, shape.cpus, shape.mem_mb,
               shape.duration if reserved else 0.0)
        entry = self._starts.get(key)
        if entry is not None and entry.gave_back == self._gave_back and (
                not reserved or entry.joined == len(self._reserved_order)):
            entry.changes = len(self._changed)  # the usual case: nothing to catch up on
            return entry
        return self._start_order_made(key, entry, kind, shape, reserved)

    def _start_order_made(self, key: tuple[bool, str, int, int, int, float],
                          entry: StartOrder | None, kind: str, shape: Shape,
                          reserved: bool) -> StartOrder:
        """``_start_order`` when the order is yet to be made, or must catch up with
        resources given back early or with nodes reserved since it was last read."""
        nodes, gpus = self.nodes, shape.gpus
        if entry is None and not reserved:
            entry = self._kept_start_order(kind, shape)
            if entry is not None:
                self._starts[key] = entry
                return entry
        if entry is None:
            # Only the nodes on the wanted side of the reservations: few are reserved.
            held = self.reserved_nodes
            side = self._reserved_order if reserved else (
                index for index in range(len(nodes)) if index not in held)
            entry = self._starts[key] = StartOrder.of(
                (index for index in side if not kind or nodes[index].total.get(kind, 0) >= gpus),
                self._version, self._earliest_on(kind, shape, reserved),
                joined=len(self._reserved_order), changes=len(self._changed),
                gave_back=self._gave_back)
            return entry
        if entry.gave_back != self._gave_back:
            # Resources came back early: a node's start may be earlier than its entry.
            for index in set(self._changed[entry.changes:]):
                if index in entry.at:
                    entry.refresh(index)
            entry.gave_back = self._gave_back
        entry.changes = len(self._changed)
        if reserved and entry.joined < len(self._reserved_order):
            for index in self._reserved_order[entry.joined:]:
                if not kind or nodes[index].total.get(kind, 0) >= gpus:
                    entry.add(index, self.now)
            entry.joined = len(self._reserved_order)
        return entry

    def _kept_start_order(self, kind: str, shape: Shape) -> StartOrder | None:
        """The order of the nodes without a reservation, from the one the kept occupancy
        keeps (core/kept_starts.py); None without one, or when it cannot serve."""
        kept = self._kept
        if kept is None or self._gave_back:  # resources given back break the bounds
            return None
        changed = kept.changed_since(self._kept_seen)
        if changed is None:
            return None
        seen = kept.starts.order(kind, shape, kept.nodes)
        made = as_of(seen, self.now)
        if made is None:
            return None
        order, at = made
        entry = StartOrder(at, self._version, self._earliest_on(kind, shape, False),
                           joined=len(self._reserved_order), changes=len(self._changed),
                           gave_back=self._gave_back, order=order)
        # Nodes changed since this pass began are not what it holds: worked out again.
        # (What this pass changed itself is out of date by its version, and read later.)
        for index in set(changed):
            entry.redo(index)
        return entry

    def _each_start(self, kind: str, shape: Shape, reserved: bool, until: float = INF
                    ) -> Iterator[tuple[float, int]]:
        """(earliest start, node) for ``shape`` on every node with (``reserved``) or
        without a reservation, earliest first (then by index), up to ``until``."""
        return self._start_order(kind, shape, reserved).each(until)

    def _earliest_on(self, kind: str, shape: Shape, reserved: bool
                     ) -> Callable[[int, float], float | None]:
        """For one order: when ``shape`` could start on a node at the earliest and run
        its whole duration (INF if never), given a time it cannot be before; None once
        the node is no longer on the side of the reservations the order keeps."""
        held, nodes, profiles, version = (self.reserved_nodes, self.nodes, self._profiles,
                                          self._version)
        gpus, cpus, mem, length = shape.gpus, shape.cpus, shape.mem_mb, shape.duration
        now, made = self.now, self._profile

        if reserved:
            def earliest(index: int, bound: float) -> float | None:
                if index not in held:
                    return None
                profile = profiles.get(index)
                if profile is None or profile.version != version.get(index, 0):
                    node = nodes[index]
                    if not node.reserved:
                        return node.earliest(kind, shape, now)
                    profile = made(index)
                return profile.earliest(kind, gpus, cpus, mem, length, bound)
        else:
            def earliest(index: int, bound: float) -> float | None:
                if index in held:
                    return None
                node = nodes[index]
                if not node.reserved:
                    return node.earliest(kind, shape, now)
                profile = profiles.get(index)
                if profile is None or profile.version != version.get(index, 0):
                    profile = made(index)
                return profile.earliest(kind, gpus, cpus, mem, length, bound)

        return earliest

    def _fits_at(self, index: int, kind: str, shape: Shape, at: float) -> bool:
        """Whether ``shape`` fits on node ``index`` from ``at`` for its whole duration."""
        node = self.nodes[index]
        if not node.reserved:
            return node.fits(kind, shape, at)
        return self._profile(index).fits(kind, shape.gpus, shape.cpus, shape.mem_mb, at,
                                         shape.duration)

    def _profile(self, index: int) -> NodeProfile:
        """Node ``index``'s resources over time, made again only when it has changed."""
        version = self._version.get(index, 0)
        profile = self._profiles.get(index)
        if profile is None or profile.version != version:
            node = self.nodes[index]
            profile = self._profiles[index] = NodeProfile(
                self.now, {kind: len(units) for kind, units in node.free.items()},
                node.cpus, node.mem, node.releases, node.reserved, version)
        return profile

    def estimate(self, shape: Shape, members: frozenset[int], group: object) -> float:
        """``earliest`` without the where, remembered: most waiting jobs share a few
        shapes. Starts and reservations only take resources away, so the answer stands
        until one of the nodes it named changes (or a preemption gives some back early)."""
        # Without nodes restricted to one user the uid changes nothing: leave it out.
        key = (group, shape if self.restricted else (shape[:6], shape.exclusive))
        known = self._estimates.get(key)
        if known is not None and known[3] == self._gave_back:
            at, where, seen, _ = known
            if not where.intersection(self._changed[seen:]):
                self._estimates[key] = (at, where, len(self._changed), self._gave_back)
                return at
        at, nodes = self.earliest(shape, members)
        self._estimates[key] = (at, frozenset(i for i, _ in nodes), len(self._changed),
                                self._gave_back)
        return at

    def earliest(self, shape: Shape, members: frozenset[int]) -> tuple[float, list[tuple[int, str]]]:
        """When and where ``shape`` could start at the earliest; (INF, []) if never."""
        if shape.nodes == 1:
            at, ready = self._earliest_one(shape, members)
            return (at, [min(ready, key=lambda r: (r[1], r[2]))[1:]]) if ready else (INF, [])
        starts: list[tuple[float, int, str]] = []
        nodes = self.nodes
        for kind in (self.matching(shape.kinds) if shape.gpus else [""]):
            for reserved in (False, True):
                found = 0
                for at, index in self._each_start(kind, shape, reserved):
                    if at == INF:
                        break
                    if index in members and self._usable(nodes[index], shape):
                        starts.append((at, index, kind))
                        found += 1
                        if found >= shape.nodes:
                            break
        best: dict[int, tuple[float, int, str]] = {}
        for entry in sorted(starts):
            best.setdefault(entry[1], entry)  # one kind per node: its earliest
        starts = sorted(best.values())
        if len(starts) < shape.nodes:
            return INF, []
        for at in sorted({t for t, _, _ in starts[shape.nodes - 1:]}):
            together = [(index, kind) for t, index, kind in starts if t <= at and (
                index not in self.reserved_nodes or self._fits_at(index, kind, shape, at))]
            if len(together) >= shape.nodes:
                return at, self._same_block(together, shape.nodes)
        # Only the first nodes of each side were looked at: with many reserved nodes the
        # nodes free together may be others (conservative backfill reserves everywhere).
        return self._earliest_together(shape, members)

    def _earliest_together(self, shape: Shape, members: frozenset[int]
                           ) -> tuple[float, list[tuple[int, str]]]:
        """``earliest`` for several nodes, looking at every member node at every time
        something comes back on one of them; slower, and only asked when the quick
        search found no time."""
        kinds = self.matching(shape.kinds) if shape.gpus else [""]
        nodes = [self.nodes[i] for i in sorted(members) if self._usable(self.nodes[i], shape)]
        times = {self.now}
        for node in nodes:
            times.update(t for t, *_ in node.releases if t > self.now)
            times.update(end for _, end, *_ in node.reserved if self.now < end < INF)
        for at in sorted(times):
            ready = [(node.index, kind) for node in nodes for kind in kinds
                     if (not kind or node.total.get(kind, 0) >= shape.gpus)
                     and self._fits_at(node.index, kind, shape, at)]
            if len({index for index, _ in ready}) >= shape.nodes:
                one: dict[int, tuple[int, str]] = {}
                for index, kind in ready:
                    one.setdefault(index, (index, kind))
                return at, self._same_block(list(one.values()), shape.nodes)
        return INF, []

    def where_to_reserve(self, shape: Shape, members: frozenset[int]
                         ) -> tuple[float, list[tuple[int, str]]]:
        """When ``shape`` could start at the earliest (as ``earliest``), and the nodes to
        hold for it then: of the nodes ready by that time, those ready last come first
        (at one time, those with the fewest units free now), so that what is idle now is
        held last and stays free for jobs that fit beside the reservation (EASY's extra
        nodes)."""
        if shape.nodes == 1:
            at, found = self._earliest_one(shape, members)
            if len(found) == 1:  # what _same_block gives for one node
                return at, [found[0][1:]]
            if not found:
                return INF, []
            nodes = self.nodes
            best: dict[int, tuple[int, int, str]] = {}
            for _, index, kind in found:
                node = nodes[index]
                if kind:
                    units = node.free.get(kind)
                    key = (len(units) if units else 0, index, kind)
                else:
                    key = (node.free_gpus(), index, kind)
                if index not in best or key < best[index]:
                    best[index] = key
            return at, [self._same_block_one(best.values())]
        kinds = self.matching(shape.kinds) if shape.gpus else [""]
        if not self.reserved_nodes and len(kinds) == 1:
            return self._reserve_where_free(kinds[0], shape, members)
        at, where = self.earliest(shape, members)
        if at == INF:
            return at, where
        ready = self._ready_by(at, shape, members)
        if len(ready) < shape.nodes:  # cannot happen: ``where`` is among them
            return at, where
        return at, self._same_block(ready, shape.nodes)

    def _reserve_where_free(self, kind: str, shape: Shape, members: frozenset[int]
                            ) -> tuple[float, list[tuple[int, str]]]:
        """``where_to_reserve`` for several nodes of one kind while no node holds a
        reservation: ``earliest`` and ``_ready_by`` then read the same one order, the
        first up to the ``shape.nodes``-th member, the second on to its start; here
        both in one walk."""
        nodes, wanted, restricted = self.nodes, shape.nodes, self.restricted
        found, at = 0, INF
        best: list[tuple[float, int, int, str]] = []
        for start, index in self._start_order(kind, shape, False).each():
            if start == INF or (found >= wanted and start > at):
                break
            if index not in members:
                continue
            node = nodes[index]
            if restricted and not self._usable(node, shape):
                continue
            found += 1
            if found == wanted:
                at = start
            if kind:
                units = node.free.get(kind)
                best.append((-start, len(units) if units else 0, index, kind))
            else:
                best.append((-start, node.free_gpus(), index, kind))
        if found < wanted:
            return INF, []
        best.sort()
        return at, self._same_block([(index, kind) for _, _, index, kind in best], wanted)

    def _earliest_one(self, shape: Shape, members: frozenset[int]
                      ) -> tuple[float, list[tuple[int, int, str]]]:
        """When a one-node ``shape`` could start at the earliest (INF if never), and every
        (kind used, node) where it could then, as (0, node, kind). Each order is read
        only up to the earliest start found so far, so a node reserved since it was
        last read is worked out again only if it may still be the answer."""
        best = INF
        found: list[tuple[int, int, str]] = []
        nodes = self.nodes
        wanted: Callable[[int], bool]
        if self.restricted:
            def wanted(index: int) -> bool:
                return index in members and self._usable(nodes[index], shape)
        else:  # every node is usable: membership alone
            wanted = members.__contains__
        # Once every node holds a reservation, the side without one is empty.
        sides = (True,) if len(self.reserved_nodes) == len(nodes) else (False, True)
        for kind in (self.matching(shape.kinds) if shape.gpus else [""]):
            for reserved in sides:
                at, indexes = self._start_order(kind, shape, reserved).first(best, wanted)
                if indexes:
                    if at < best:  # earlier than all found so far: they are dropped
                        best, found = at, []
                    for index in indexes:
                        found.append((0, index, kind))
        return best, found

    def _ready_by(self, at: float, shape: Shape, members: frozenset[int]
                  ) -> list[tuple[int, str]]:
        """Every member node (and the kind it would use) where ``shape`` could start at
        ``at`` and run its whole duration: latest ready first, then fewest units free now,
        then by index."""
        best: dict[int, tuple[float, int, int, str]] = {}
        nodes = self.nodes
        for kind in (self.matching(shape.kinds) if shape.gpus else [""]):
            for reserved in (False, True):
                for ready, index in self._each_start(kind, shape, reserved, at):
                    if index not in members:
                        continue
                    node = nodes[index]
                    if not self._usable(node, shape) or (
                            reserved and not self._fits_at(index, kind, shape, at)):
                        continue
                    key = (-ready, node.count(kind) if kind else node.free_gpus(), index, kind)
                    known = best.get(index)
                    if known is None or key < known:
                        best[index] = key
        return [(index, kind) for _, _, index, kind in sorted(best.values())]

    def hold_for_pool(self, indexes: Sequence[int], kind: str, until: float, job_id: int,
                      holds: dict[int, tuple[float, float, str, int, float, float]]) -> None:
        """Hold the unit of each of these 1-unit nodes from now until ``until`` for the
        reservations counted in their pool (``job_id``: the one that ends last), against
        jobs planned per node. ``holds`` keeps each node's hold, replaced by the next."""
        for index in indexes:
            node = self._own(index)
            earlier = holds.get(index)
            if earlier is not None:
                node.reserved = [r for r in node.reserved if r is not earlier]
            holds[index] = (self.now, until, kind, 1, 0.0, 0.0)
            node.reserved.append(holds[index])
            self.owners[(index, self.now)] = job_id
            self._join_reserved(index)
            self._touched(index)

    def reserve(self, at: float, where: Sequence[tuple[int, str]], shape: Shape,
                job_id: int = 0) -> None:
        """Hold ``shape`` on these nodes from ``at`` for its duration, for ``job_id``."""
        end, cpus, mem = at + shape.duration, float(shape.cpus), float(shape.mem_mb)
        owners, profiles, version = self.owners, self._profiles, self._version
        own = self._own
        for index, kind in where:
            owners[(index, at)] = job_id
            node = own(index)
            profile = profiles.get(index)
            if profile is not None and profile.version != version.get(index, 0):
                profile = None
            node.reserved.append((at, end, kind, shape.gpus, cpus, mem))
            self._join_reserved(index)
            self._touched(index)
            if profile is not None:  # follow the reservation instead of making it again
                profile.take_out(at, end, kind, shape.gpus, cpus, mem)
                profile.version = version[index]

    def _join_reserved(self, index: int) -> None:
        if index not in self.reserved_nodes:
            self.reserved_nodes.add(index)
            self._reserved_order.append(index)
