"""Matching: which nodes (and which of their units) a job may start on now.

Best fit walks the buckets of free units upward. Within one pass resources only shrink,
so a shape that could not start now is remembered, and any job needing at least as much
for at least as long is refused without a search. A start must leave every reservation
whole for the job's whole time limit, which is what makes backfill safe.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable

from gpusched.core.model import GpuView, PendingJob
from gpusched.core.resources import PassResources
from gpusched.core.topology import choose_gpus
from gpusched.core.units import INF, Shape


class MatchingMixin(PassResources):
    """Starting jobs now: best-fit placement, the failures a pass remembers, and the
    shapes an exclusive job may take."""

    def whole_shapes(self, job: PendingJob, members: frozenset[int]
                     ) -> list[tuple[Shape, frozenset[int]]]:
        """An exclusive job's shapes, one per node size that could hold it, smallest
        first: every unit of its GPU kind on each node, with the nodes of that size. (A
        job on several nodes runs on nodes of one size.) A job asking for no GPU holds
        every whole GPU of its node's kind, as Slurm gives an exclusive job all the GRES
        of its nodes; nodes without GPUs come first."""
        shape = Shape.of(job)
        kinds = self.matching(job.gpu_kinds)
        by_size: dict[int, set[int]] = {}
        for index in members:
            sizes = [self.nodes[index].total.get(kind, 0) for kind in kinds]
            for size in sizes if job.gpus else [max(sizes, default=0)]:
                if size >= job.gpus:
                    by_size.setdefault(size, set()).add(index)
        if not by_size:
            return [(shape, members)]  # no node is big enough: it waits as it would anyway
        return [(shape._replace(gpus=size), frozenset(nodes))
                for size, nodes in sorted(by_size.items())]

    def _failed_before(self, key: tuple[object, ...], gpus: int, cpus: int, mem: int,
                       duration: float) -> bool:
        failed = self._failed.get(key)
        if failed:
            for g, c, m, d in failed:
                if gpus >= g and cpus >= c and mem >= m and duration >= d:
                    return True
        return False

    def refused(self, job: PendingJob, group: object) -> bool:
        """Whether ``job`` needs at least as much, for at least as long, as a shape that
        ``place_now`` could not start in this pass: then it cannot start either."""
        key = (group, job.gpu_kinds, max(1, job.nodes), job.uid if self.restricted else None)
        return self._failed_before(key, job.gpus, job.cpus, job.mem_mb,
                                   INF if job.time_limit is None else float(job.time_limit))

    # -- now --------------------------------------------------------------------------
    def place_now(self, shape: Shape, members: frozenset[int],
                  group: object) -> list[tuple[int, str]] | None:
        """Best-fit nodes (and the kind used on each) to start ``shape`` on now.

        ``members`` are the node indexes it may use and ``group`` names that set (its
        partition) for remembering failures. None when it cannot start now without
        breaking a reservation.
        """
        key = (group, shape.kinds, shape.nodes, shape.uid if self.restricted else None)
        if self._failed_before(key, shape.gpus, shape.cpus, shape.mem_mb, shape.duration):
            return None
        found = self._search_now(shape, members)
        if found is None:
            self._failed.setdefault(key, []).append(
                (shape.gpus, shape.cpus, shape.mem_mb, shape.duration))
        return found

    def state(self) -> tuple[int, int, float]:
        """What changes whenever what could start now may have: the starts and
        reservations made, the preemptions, the present."""
        return len(self._changed), self._gave_back, self.now

    def ready_now(self, shape: Shape, members: frozenset[int]) -> frozenset[int]:
        """The nodes of ``members`` where one node's part of ``shape`` could start now,
        each by the checks ``place_now`` makes of it (no search among them)."""
        kinds = self.matching(shape.kinds) if shape.gpus else [""]
        return frozenset(
            index for index in self._open_now(shape, members)
            if self._usable(self.nodes[index], shape)
            and any(self._fits_now(self.nodes[index], kind, shape) for kind in kinds))

    def _open_now(self, shape: Shape, members: frozenset[int]) -> frozenset[int]:
        """``members`` less the nodes ``shape`` may not join now: those a whole-node job
        holds and, for an exclusive shape, those not idle."""
        if not (self.whole or shape.exclusive):
            return members
        return frozenset(i for i in members if i not in self.whole
                         and (not shape.exclusive or self._idle(i)))

    def _search_now(self, shape: Shape, members: frozenset[int]) -> list[tuple[int, str]] | None:
        """Best fit: the nodes with the fewest free units that hold ``shape``; among those,
        nodes where it ends before a reservation come first, since what no reservation
        holds is all that a job running past the reservation could use."""
        members = self._open_now(shape, members)
        reserved = self.reserved_nodes
        if shape.gpus == 0:
            fit = [(node.free_gpus(), node.index not in reserved, node.index)
                   for node in self.nodes
                   if node.index in members and self._usable(node, shape)
                   and self._fits_now(node, "", shape)]
            fit.sort()
            return [(index, "") for _, _, index in fit[:shape.nodes]] \
                if len(fit) >= shape.nodes else None
        kinds = self.matching(shape.kinds)
        if shape.nodes == 1:
            for count in range(shape.gpus, self.most + 1):
                first = self._first_fit(kinds, count, shape, members, None)
                if first is None:
                    continue
                if first[0] in reserved or not reserved:
                    return [first]
                return [self._first_fit(kinds, count, shape, members, reserved) or first]
            return None
        return self._several_now(shape, kinds, members)

    def _several_now(self, shape: Shape, kinds: list[str], members: frozenset[int]
                     ) -> list[tuple[int, str]] | None:
        """Best fit on several nodes: by fewest free units, and within one count nodes
        holding a reservation first, then by kind and index. Without topology blocks
        only the first ``shape.nodes`` of that order are taken, so the search stops
        there; with blocks, the tightest block is chosen among them all."""
        # Fewer nodes with enough free units than it asks for, members or not: no start.
        enough = sum(len(self.buckets[kind][count]) for kind in kinds
                     for count in range(shape.gpus, self.most + 1))
        if enough < shape.nodes:
            return None
        reserved, wanted = self.reserved_nodes, shape.nodes
        stop = not self.blocks
        chosen: list[tuple[int, str]] = []
        seen: set[int] = set()
        nodes, restricted = self.nodes, self.restricted
        cpus, mem = shape.cpus, shape.mem_mb
        for count in range(shape.gpus, self.most + 1):
            for held in (True, False) if reserved else (False,):
                for kind in kinds:
                    for index in self.buckets[kind][count]:
                        if index in seen or index not in members or (index in reserved) != held:
                            continue
                        node = nodes[index]
                        if restricted and not self._usable(node, shape):
                            continue
                        # _fits_now: the node has ``count`` units of ``kind`` free
                        if held:
                            if not self._held_fits_now(node, kind, shape):
                                continue
                        elif node.cpus < cpus or node.mem < mem:
                            continue
                        seen.add(index)
                        chosen.append((index, kind))
                        if stop and not held and len(chosen) >= wanted:
                            return chosen
                if stop and len(chosen) >= wanted:
                    return chosen[:wanted]
        if len(chosen) < wanted:
            return None
        return self._same_block(chosen, wanted)

    def _first_fit(self, kinds: list[str], count: int, shape: Shape, members: frozenset[int],
                   among: set[int] | None) -> tuple[int, str] | None:
        """The first member node (by kind, then index) with exactly ``count`` free units of
        one of ``kinds`` where ``shape`` fits now; only nodes of ``among`` when given."""
        nodes, reserved, restricted = self.nodes, self.reserved_nodes, self.restricted
        for kind in kinds:
            bucket = self.buckets[kind][count]
            candidates: Iterable[int] = bucket
            if among is not None and len(among) < len(bucket):
                candidates = (i for i in sorted(among) if nodes[i].count(kind) == count
                              and kind in nodes[i].total)
            for index in candidates:
                if index in members and (among is None or index in among):
                    node = nodes[index]
                    if restricted and not self._usable(node, shape):
                        continue
                    # _fits_now: the node has ``count`` units of ``kind`` free
                    if index in reserved:
                        if self._held_fits_now(node, kind, shape):
                            return index, kind
                    elif node.cpus >= shape.cpus and node.mem >= shape.mem_mb:
                        return index, kind
        return None

    def take(self, index: int, kind: str, shape: Shape) -> tuple[GpuView, ...]:
        """Start ``shape`` on node ``index`` now: the units it gets, chosen by topology."""
        node = self._own_units(index)
        gpus: tuple[GpuView, ...] = ()
        if shape.gpus:
            free = node.free[kind]
            before = len(free)
            if shape.gpus == before and kind not in node.slices:
                gpus = tuple(free)  # every free GPU, as choose_gpus gives them
            else:
                gpus = choose_gpus(node.view, free, shape.gpus, kind in node.slices)
            if len(gpus) == before:
                node.free[kind] = []  # every free unit
            else:
                taken = {gpu.uuid for gpu in gpus}
                node.free[kind] = [gpu for gpu in free if gpu.uuid not in taken]
            self._bucket(kind, before).remove(index)
            insort(self._bucket(kind, before - shape.gpus), index)
        node.cpus -= shape.cpus
        node.mem -= shape.mem_mb
        if shape.duration < INF:
            insort(node.releases, (self.now + shape.duration, kind, shape.gpus,
                                   float(shape.cpus), float(shape.mem_mb), -1))
        if shape.exclusive:
            self._hold_whole(index, self.now + shape.duration)
        self.started.add(index)
        changed = self._changed  # _touched
        changed.append(index)
        self._version[index] = len(changed)
        return gpus
