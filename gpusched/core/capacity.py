"""Free resources over time: what may start now, and when a blocked job could start.

A pass keeps, for every usable node, its free GPUs (by kind: a GPU type, or a MIG
profile), CPUs and memory now; the times at which running jobs will give resources back
(their time limits); and the reservations made for blocked jobs. Starting a job now must
leave every reservation whole for its whole time limit, which is what makes backfill safe.

Speed comes from three things. Nodes sit in buckets by how many GPUs of each kind they
have free, so best fit walks buckets upward instead of scanning every node. A node with no
reservation only gains resources as time goes on, so a job fits there for its whole time
limit exactly when it fits at its start. And within one pass resources only shrink, so a
shape that could not start now is remembered, and any job needing at least as much for at
least as long is refused without a search.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from itertools import combinations
from typing import NamedTuple

from gpusched.core.model import GpuView, NodeState, NodeView, PendingJob, RunningJob
from gpusched.core.shapes import is_mig_profile
from gpusched.core.topology import choose_gpus

INF = math.inf


def kind_matches(kind: str, is_slice: bool, wanted: tuple[str, ...]) -> bool:
    """Whether a unit of ``kind`` satisfies a request for one of ``wanted``.

    No kinds asks for any whole GPU. A GPU type matches itself and its variants (``a100``
    matches ``a100-80gb``); a MIG profile matches only slices of that profile.
    """
    if not wanted:
        return not is_slice
    for want in wanted:
        if is_mig_profile(want):
            if is_slice and kind == want:
                return True
        elif not is_slice and (kind == want or kind.startswith(want + "-")):
            return True
    return False


class Shape(NamedTuple):
    """What a job needs on each of its nodes, and for how long.

    A NamedTuple: a pass builds one for every job it examines, and a tuple is several
    times cheaper to build than a frozen dataclass.
    """

    kinds: tuple[str, ...]
    gpus: int
    cpus: int
    mem_mb: int
    nodes: int
    duration: float  # INF: no time limit
    uid: int
    exclusive: bool = False  # needs wholly idle nodes, and holds them whole

    @classmethod
    def of(cls, job: PendingJob) -> Shape:
        """The shape of a pending job."""
        return cls(job.gpu_kinds, job.gpus, job.cpus, job.mem_mb, max(1, job.nodes),
                   INF if job.time_limit is None else float(job.time_limit), job.uid,
                   job.exclusive)


def any_could_start(free_per_node: Iterable[int], shapes: Iterable[tuple[int, int]]) -> bool:
    """Whether any of ``shapes`` (GPUs per node, nodes) could find its GPUs free now:
    ``nodes`` nodes with at least ``gpus`` free GPUs each. A necessary condition only
    (GPU types, CPUs, memory and reservations are not looked at): when it fails, a pass
    starts nothing, so a caller that only wants starts may skip the pass."""
    free = sorted(free_per_node, reverse=True)
    return any(nodes <= len(free) and free[nodes - 1] >= gpus for gpus, nodes in shapes)


class _Units:
    """What a pass needs to know of one usable node before any job: its units by kind
    (healthy, never a GPU in MIG mode whole), in index order."""

    __slots__ = ("view", "units", "total", "slices")

    def __init__(self, view: NodeView) -> None:
        self.view = view
        self.units: dict[str, list[GpuView]] = {}
        self.slices: set[str] = set()  # the kinds here that are MIG slices
        for gpu in view.gpus:
            if gpu.mig_mode or not gpu.healthy:
                continue
            kind = gpu.kind
            self.units.setdefault(kind, []).append(gpu)
            if gpu.mig_profile is not None:
                self.slices.add(kind)
        for units in self.units.values():
            units.sort(key=lambda g: g.index)
        self.total = {kind: len(units) for kind, units in self.units.items()}


class Inventory:
    """The usable nodes of a snapshot (UP, in name order) and their units: built once
    for a tuple of nodes and reused by every pass given that same tuple."""

    def __init__(self, nodes: Iterable[NodeView]) -> None:
        usable = sorted((n for n in nodes if n.state is NodeState.UP), key=lambda n: n.name)
        self.nodes = [_Units(view) for view in usable]
        self.index = {view.name: i for i, view in enumerate(usable)}
        self.kind_of: dict[str, tuple[int, str]] = {
            gpu.uuid: (i, gpu.kind) for i, view in enumerate(usable) for gpu in view.gpus}
        self.kinds = sorted({kind for node in self.nodes for kind in node.total})
        self.slice_kinds = {kind for node in self.nodes for kind in node.slices}
        self.most = max((units for node in self.nodes for units in node.total.values()),
                        default=0)
        self.restricted = any(node.view.run_uid is not None for node in self.nodes)


_last_inventory: tuple[tuple[NodeView, ...], Inventory] | None = None


def inventory(nodes: Iterable[NodeView]) -> Inventory:
    """The inventory of ``nodes``; the same tuple as last time gives the same one back."""
    global _last_inventory
    if isinstance(nodes, tuple):
        last = _last_inventory
        if last is not None and last[0] is nodes:
            return last[1]
        built = Inventory(nodes)
        _last_inventory = (nodes, built)
        return built
    return Inventory(nodes)


class _Node:
    """One usable node's free resources now, later releases, and reservations."""

    __slots__ = ("index", "view", "free", "cpus", "mem", "releases", "reserved", "total",
                 "slices")

    def __init__(self, index: int, units: _Units, allocated: set[str] | None) -> None:
        self.index = index
        self.view = units.view
        self.total = units.total
        self.slices = units.slices
        if allocated is None:
            self.free = {kind: list(gpus) for kind, gpus in units.units.items()}
        else:
            self.free = {kind: [gpu for gpu in gpus if gpu.uuid not in allocated]
                         for kind, gpus in units.units.items()}
        self.cpus: float = self.view.cpus if self.view.cpus else INF
        self.mem: float = self.view.memory_mb if self.view.memory_mb else INF
        # (time, kind, gpus, cpus, mem, job id) given back at time; sorted by time.
        self.releases: list[tuple[float, str, int, float, float, int]] = []
        # (start, end, kind, gpus, cpus, mem) held for a blocked job.
        self.reserved: list[tuple[float, float, str, int, float, float]] = []

    def count(self, kind: str) -> int:
        """Free units of ``kind`` now."""
        units = self.free.get(kind)
        return len(units) if units else 0

    def free_gpus(self) -> int:
        """Free units of every kind now."""
        return sum(len(units) for units in self.free.values())

    def available(self, kind: str, at: float) -> tuple[float, float, float]:
        """GPUs of ``kind``, CPUs and memory free at time ``at``, reservations taken."""
        gpus: float = self.count(kind)
        cpus, mem = self.cpus, self.mem
        for when, k, g, c, m, _ in self.releases:
            if when > at:
                break
            if k == kind:
                gpus += g
            cpus += c
            mem += m
        for start, end, k, g, c, m in self.reserved:
            if start <= at < end:
                if k == kind:
                    gpus -= g
                cpus -= c
                mem -= m
        return gpus, cpus, mem

    def fits(self, kind: str, shape: Shape, start: float) -> bool:
        """Whether ``shape`` fits here from ``start`` for its whole duration."""
        end = start + shape.duration
        for at in (start, *(s for s, _, _, _, _, _ in self.reserved if start < s < end)):
            gpus, cpus, mem = self.available(kind, at)
            if gpus < shape.gpus or cpus < shape.cpus or mem < shape.mem_mb:
                return False
        return True

    def earliest(self, kind: str, shape: Shape, now: float) -> float:
        """The first time ``shape`` could start here and run its whole duration; INF if never."""
        if not self.reserved:
            # Without reservations resources only come back: one sweep of the releases.
            gpus: float = self.count(kind)
            cpus, mem = self.cpus, self.mem
            releases, i, count, at = self.releases, 0, len(self.releases), now
            while True:
                while i < count and releases[i][0] <= at:
                    _, k, g, c, m, _ = releases[i]
                    if k == kind:
                        gpus += g
                    cpus += c
                    mem += m
                    i += 1
                if gpus >= shape.gpus and cpus >= shape.cpus and mem >= shape.mem_mb:
                    return at
                if i == count:
                    return INF
                at = releases[i][0]
        times = {now}
        times.update(t for t, *_ in self.releases if t > now)
        times.update(e for _, e, _, _, _, _ in self.reserved if now < e < INF)
        for at in sorted(times):
            if self.fits(kind, shape, at):
                return at
        return INF


class Capacity:
    """The resources of the usable nodes during one pass."""

    def __init__(self, nodes: Iterable[NodeView], running: Iterable[RunningJob],
                 now: float) -> None:
        self.now = now
        running = list(running)
        known = inventory(nodes)
        self.index = known.index
        self.kind_of = known.kind_of
        allocated = {uuid for job in running for uuid in job.gpu_uuids}
        busy = {self.index.get(name) for job in running for name in job.nodes or (job.node,)}
        self.nodes = [_Node(i, units, allocated if i in busy else None)
                      for i, units in enumerate(known.nodes)]
        self._release_running(running)
        self.whole: set[int] = set()  # nodes an exclusive job holds whole
        self.started: set[int] = set()  # nodes a job started on in this pass
        for job in running:
            if job.exclusive:
                for name in job.nodes or (job.node,):
                    if name in self.index:
                        self._hold_whole(self.index[name], job.end_time, buckets=False)
        self.kinds = known.kinds
        self.slice_kinds = known.slice_kinds
        self.most = known.most
        # buckets[kind][n]: indexes of the nodes with exactly n free units of kind, sorted.
        self.buckets: dict[str, list[list[int]]] = {
            kind: [[] for _ in range(self.most + 1)] for kind in self.kinds}
        for node in self.nodes:
            for kind in node.total:
                self.buckets[kind][node.count(kind)].append(node.index)
        self.reserved_nodes: set[int] = set()
        self.owners: dict[tuple[int, float], int] = {}  # (node, start) -> the reserved job
        self._matching: dict[tuple[str, ...], list[str]] = {}
        self._failed: dict[tuple[object, ...], list[tuple[int, int, int, float]]] = {}
        # Per (reserved?, kind, gpus, cpus, mem, duration): sorted (earliest start, node),
        # each node's entry, and how much of the change log it has seen.
        self._starts: dict[tuple[bool, str, int, int, int, float],
                           tuple[list[tuple[float, int]], dict[int, float], int]] = {}
        self._changed: list[int] = []  # nodes changed by a start or a reservation, in order
        self.restricted = known.restricted
        self.preempted: set[int] = set()  # running jobs this pass decided to stop
        # (group, shape) -> (start, the nodes it is on, change log seen, preemptions seen)
        self._estimates: dict[tuple[object, Shape], tuple[float, frozenset[int], int, int]] = {}
        self._gave_back = 0  # preemptions so far: they bring resources back earlier

    def _release_running(self, running: list[RunningJob]) -> None:
        self.on_node: dict[int, list[RunningJob]] = {}
        index, nodes, on_node = self.index, self.nodes, self.on_node
        for job in running:
            for name in job.nodes or (job.node,):
                at = index.get(name)
                if at is not None:
                    node = nodes[at]
                    node.cpus -= job.cpus
                    node.mem -= job.mem_mb
                    if at in on_node:
                        on_node[at].append(job)
                    else:
                        on_node[at] = [job]
            if job.end_time is not None:
                self._add_releases(job, job.end_time, False)
        for at in on_node:
            nodes[at].releases.sort()

    def _hold_whole(self, index: int, end: float | None, buckets: bool = True) -> None:
        """Hold what is still free on node ``index`` for an exclusive job until ``end``
        (None: for good): nothing else starts or is planned there before."""
        node = self.nodes[index]
        self.whole.add(index)
        until = INF if end is None else end
        for kind, free in node.free.items():
            if free:
                if buckets:
                    self.buckets[kind][len(free)].remove(index)
                    insort(self.buckets[kind][0], index)
                if until < INF:
                    insort(node.releases, (until, kind, len(free), 0.0, 0.0, -1))
                node.free[kind] = []
        if until < INF and (node.cpus or node.mem):
            insort(node.releases, (until, "", 0, node.cpus, node.mem, -1))
        node.cpus = node.mem = 0.0
        if buckets:  # not while the capacity is being built
            self._touched(index)

    def _idle(self, index: int) -> bool:
        """Whether nothing runs on node ``index`` and nothing has started there."""
        node = self.nodes[index]
        return (index not in self.whole and index not in self.started
                and not self.on_node.get(index)
                and all(len(node.free.get(kind, ())) == n for kind, n in node.total.items())
                and node.cpus == (node.view.cpus or INF)
                and node.mem == (node.view.memory_mb or INF))

    def whole_shapes(self, job: PendingJob, members: frozenset[int]
                     ) -> list[tuple[Shape, frozenset[int]]]:
        """An exclusive job's shapes, one per node size that could hold it, smallest
        first: every unit of its GPU kind on each node, with the nodes of that size. (A
        job on several nodes runs on nodes of one size.)"""
        shape = Shape.of(job)
        if not job.gpus:
            return [(shape, members)]
        kinds = self.matching(job.gpu_kinds)
        by_size: dict[int, set[int]] = {}
        for index in members:
            for kind in kinds:
                size = self.nodes[index].total.get(kind, 0)
                if size >= job.gpus:
                    by_size.setdefault(size, set()).add(index)
        if not by_size:
            return [(shape, members)]  # no node is big enough: it waits as it would anyway
        return [(shape._replace(gpus=size), frozenset(nodes))
                for size, nodes in sorted(by_size.items())]

    def _add_releases(self, job: RunningJob, end: float, keep_sorted: bool = True) -> None:
        """Record when ``job`` gives back its GPUs, CPUs and memory, on each of its nodes
        (in time order, unless the caller sorts them all afterwards)."""
        if end == INF:
            return
        add = insort if keep_sorted else list.append
        held: dict[tuple[int, str], int] = {}
        kind_of = self.kind_of
        for uuid in job.gpu_uuids:
            where = kind_of.get(uuid)
            if where is not None:
                held[where] = held.get(where, 0) + 1
        cpus, mem = float(job.cpus), float(job.mem_mb)
        for name in job.nodes or (job.node,) if cpus or mem else ():
            index = self.index.get(name)
            if index is not None:
                add(self.nodes[index].releases, (end, "", 0, cpus, mem, job.job_id))
        for (index, kind), count in held.items():
            add(self.nodes[index].releases, (end, kind, count, 0.0, 0.0, job.job_id))

    def advance(self, now: float) -> None:
        """Move this capacity's present to ``now`` (later), nothing else having changed:
        what was worked out for the earlier present is forgotten."""
        self.now = now
        self._failed.clear()
        self._starts.clear()
        self._estimates.clear()

    def _touched(self, index: int) -> None:
        self._changed.append(index)

    # -- preemption -------------------------------------------------------------------
    def release_early(self, job: RunningJob, at: float) -> None:
        """``job`` is being stopped: it gives everything back at ``at``."""
        self.preempted.add(job.job_id)
        self._gave_back += 1
        for name in job.nodes or (job.node,):
            index = self.index.get(name)
            if index is not None:
                node = self.nodes[index]
                node.releases = [e for e in node.releases if e[5] != job.job_id]
                self._touched(index)
        self._add_releases(job, at)

    def _cheapest(self, node: _Node, kind: str, shape: Shape,
                  candidates: list[RunningJob]) -> tuple[float, list[RunningJob]] | None:
        """The victims on ``node`` whose stopping frees room for ``shape`` at the least
        loss of work (GPU-seconds run so far, all lost on a requeue); None if none do."""
        def frees(job: RunningJob) -> int:
            return sum(1 for u in job.gpu_uuids if self.kind_of.get(u) == (node.index, kind))

        def loss(job: RunningJob) -> float:
            ran = self.now - job.start_time if job.start_time is not None else 0.0
            return max(1, len(job.gpu_uuids)) * max(ran, 0.0)

        def enough(chosen: Sequence[RunningJob]) -> bool:
            return (node.count(kind) + sum(frees(j) for j in chosen) >= shape.gpus
                    and node.cpus + sum(j.cpus for j in chosen) >= shape.cpus
                    and node.mem + sum(j.mem_mb for j in chosen) >= shape.mem_mb)

        best: tuple[float, int, list[RunningJob]] | None = None
        if len(candidates) <= 10:
            for size in range(1, len(candidates) + 1):
                for chosen in combinations(candidates, size):
                    if enough(chosen):
                        cost = sum(loss(j) for j in chosen)
                        if best is None or (cost, size) < best[:2]:
                            best = (cost, size, list(chosen))
        else:  # many small jobs: cheapest per GPU first
            chosen_list: list[RunningJob] = []
            for job in sorted(candidates, key=lambda j: (loss(j) / max(1, frees(j)), j.job_id)):
                chosen_list.append(job)
                if enough(chosen_list):
                    best = (sum(loss(j) for j in chosen_list), len(chosen_list), chosen_list)
                    break
        return None if best is None else (best[0], best[2])

    def victims_for(self, shape: Shape, members: frozenset[int], preemptable: frozenset[str]
                    ) -> tuple[list[tuple[int, str]], list[RunningJob]] | None:
        """Nodes for ``shape`` and the running jobs of ``preemptable`` QOS to stop for it,
        losing the least work; None when no choice makes room. Nodes holding a
        reservation are left alone."""
        options: list[tuple[float, int, int, str, list[RunningJob]]] = []
        for index in sorted(members - self.reserved_nodes):
            node = self.nodes[index]
            if not self._usable(node, shape):
                continue
            candidates = [job for job in self.on_node.get(index, ())
                          if job.qos in preemptable and not job.preempting
                          and job.job_id not in self.preempted]
            for kind in (self.matching(shape.kinds) if shape.gpus else [""]):
                if kind and node.total.get(kind, 0) < shape.gpus:
                    continue
                if self._fits_now(node, kind, shape):  # a multi-node job's free node
                    options.append((0.0, 0, index, kind, []))
                    continue
                found = self._cheapest(node, kind, shape, candidates) if candidates else None
                if found is not None:
                    options.append((found[0], len(found[1]), index, kind, found[1]))
        options.sort(key=lambda o: (o[0], o[1], o[2]))
        where: list[tuple[int, str]] = []
        victims: dict[int, RunningJob] = {}
        for _, _, index, kind, chosen in options:
            if all(index != i for i, _ in where):
                where.append((index, kind))
                victims.update((job.job_id, job) for job in chosen)
            if len(where) == shape.nodes:
                return (where, sorted(victims.values(), key=lambda j: j.job_id)) \
                    if victims else None
        return None

    # -- which nodes may run a shape ------------------------------------------------
    def matching(self, wanted: tuple[str, ...]) -> list[str]:
        """The kinds in this cluster that satisfy a request for ``wanted``."""
        found = self._matching.get(wanted)
        if found is None:
            found = [k for k in self.kinds if kind_matches(k, k in self.slice_kinds, wanted)]
            self._matching[wanted] = found
        return found

    def _usable(self, node: _Node, shape: Shape) -> bool:
        run_uid = node.view.run_uid
        return run_uid is None or run_uid == shape.uid

    def _fits_now(self, node: _Node, kind: str, shape: Shape) -> bool:
        if node.index in self.reserved_nodes:
            return node.fits(kind, shape, self.now)
        return (node.count(kind) >= shape.gpus and node.cpus >= shape.cpus
                and node.mem >= shape.mem_mb)

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

    def _search_now(self, shape: Shape, members: frozenset[int]) -> list[tuple[int, str]] | None:
        """Best fit: the nodes with the fewest free units that hold ``shape``; among those,
        nodes where it ends before a reservation come first, since what no reservation
        holds is all that a job running past the reservation could use."""
        if self.whole or shape.exclusive:
            members = frozenset(i for i in members if i not in self.whole
                                and (not shape.exclusive or self._idle(i)))
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
        chosen: list[tuple[int, str]] = []
        seen: set[int] = set()
        for count in range(shape.gpus, self.most + 1):
            level: list[tuple[int, str]] = []
            for kind in kinds:
                for index in self.buckets[kind][count]:
                    if index in seen or index not in members:
                        continue
                    node = self.nodes[index]
                    if self._usable(node, shape) and self._fits_now(node, kind, shape):
                        seen.add(index)
                        level.append((index, kind))
            level.sort(key=lambda entry: entry[0] not in reserved)  # stable
            chosen.extend(level)
        if len(chosen) < shape.nodes:
            return None
        return self._same_block(chosen, shape.nodes)

    def _first_fit(self, kinds: list[str], count: int, shape: Shape, members: frozenset[int],
                   among: set[int] | None) -> tuple[int, str] | None:
        """The first member node (by kind, then index) with exactly ``count`` free units of
        one of ``kinds`` where ``shape`` fits now; only nodes of ``among`` when given."""
        for kind in kinds:
            bucket = self.buckets[kind][count]
            candidates: Iterable[int] = bucket
            if among is not None and len(among) < len(bucket):
                candidates = (i for i in sorted(among) if self.nodes[i].count(kind) == count
                              and kind in self.nodes[i].total)
            for index in candidates:
                if index in members and (among is None or index in among):
                    node = self.nodes[index]
                    if self._usable(node, shape) and self._fits_now(node, kind, shape):
                        return index, kind
        return None

    def _same_block(self, ordered: list[tuple[int, str]], count: int) -> list[tuple[int, str]]:
        """``count`` of the (best first) nodes, from one topology block when one has enough."""
        blocks: dict[str, list[tuple[int, str]]] = {}
        for entry in ordered:
            block = self.nodes[entry[0]].view.block
            if block is not None:
                blocks.setdefault(block, []).append(entry)
        enough = [b for b in blocks.values() if len(b) >= count]
        if enough:  # the tightest block that holds it, leaving bigger ones whole
            return min(enough, key=len)[:count]
        return ordered[:count]

    def take(self, index: int, kind: str, shape: Shape) -> tuple[GpuView, ...]:
        """Start ``shape`` on node ``index`` now: the units it gets, chosen by topology."""
        node = self.nodes[index]
        gpus: tuple[GpuView, ...] = ()
        if shape.gpus:
            free = node.free[kind]
            before = len(free)
            gpus = choose_gpus(node.view, free, shape.gpus, kind in node.slices)
            taken = {gpu.uuid for gpu in gpus}
            node.free[kind] = [gpu for gpu in free if gpu.uuid not in taken]
            bucket = self.buckets[kind]
            bucket[before].remove(index)
            insort(bucket[before - shape.gpus], index)
        node.cpus -= shape.cpus
        node.mem -= shape.mem_mb
        if shape.duration < INF:
            insort(node.releases, (self.now + shape.duration, kind, shape.gpus,
                                   float(shape.cpus), float(shape.mem_mb), -1))
        if shape.exclusive:
            self._hold_whole(index, self.now + shape.duration)
        self.started.add(index)
        self._touched(index)
        return gpus

    # -- later ------------------------------------------------------------------------
    def _sorted_starts(self, kind: str, shape: Shape, reserved: bool) -> list[tuple[float, int]]:
        """(earliest start, node) for ``shape`` on every node with (``reserved``) or
        without a reservation, sorted; kept between calls and refreshed only for the
        nodes changed since.

        A node without a reservation only gains resources as time goes on, so when a
        shape could start there does not depend on how long it runs: one list serves
        every job of the same size.
        """
        key = (reserved, kind, shape.gpus, shape.cpus, shape.mem_mb,
               shape.duration if reserved else 0.0)

        def wanted(index: int) -> bool:
            return (index in self.reserved_nodes) == reserved and (
                not kind or self.nodes[index].total.get(kind, 0) >= shape.gpus)

        entry = self._starts.get(key)
        if entry is None:
            at = {node.index: node.earliest(kind, shape, self.now)
                  for node in self.nodes if wanted(node.index)}
            starts = sorted((t, index) for index, t in at.items())
        else:
            starts, at, seen = entry
            for index in set(self._changed[seen:]):
                old = at.pop(index, None)
                if old is not None:
                    del starts[bisect_left(starts, (old, index))]
                if wanted(index):
                    at[index] = self.nodes[index].earliest(kind, shape, self.now)
                    insort(starts, (at[index], index))
        self._starts[key] = (starts, at, len(self._changed))
        return starts

    def estimate(self, shape: Shape, members: frozenset[int], group: object) -> float:
        """``earliest`` without the where, remembered: most waiting jobs share a few
        shapes. Starts and reservations only take resources away, so the answer stands
        until one of the nodes it named changes (or a preemption gives some back early)."""
        key = (group, shape if self.restricted else shape._replace(uid=0))
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
        starts: list[tuple[float, int, str]] = []
        for kind in (self.matching(shape.kinds) if shape.gpus else [""]):
            for reserved in (False, True):
                found = 0
                for at, index in self._sorted_starts(kind, shape, reserved):
                    if at == INF or found >= shape.nodes:
                        break
                    if index in members and self._usable(self.nodes[index], shape):
                        starts.append((at, index, kind))
                        found += 1
        best: dict[int, tuple[float, int, str]] = {}
        for entry in sorted(starts):
            best.setdefault(entry[1], entry)  # one kind per node: its earliest
        starts = sorted(best.values())
        if len(starts) < shape.nodes:
            return INF, []
        if shape.nodes == 1:
            at, index, kind = starts[0]
            return at, [(index, kind)]
        for at in sorted({t for t, _, _ in starts[shape.nodes - 1:]}):
            ready = [(index, kind) for t, index, kind in starts if t <= at and (
                index not in self.reserved_nodes or self.nodes[index].fits(kind, shape, at))]
            if len(ready) >= shape.nodes:
                return at, self._same_block(ready, shape.nodes)
        return INF, []

    def where_to_reserve(self, shape: Shape, members: frozenset[int]
                         ) -> tuple[float, list[tuple[int, str]]]:
        """When ``shape`` could start at the earliest (as ``earliest``), and the nodes to
        hold for it then: of the nodes ready by that time, those ready last come first
        (at one time, those with the fewest units free now), so that what is idle now is
        held last and stays free for jobs that fit beside the reservation (EASY's extra
        nodes)."""
        at, where = self.earliest(shape, members)
        if at == INF:
            return at, where
        ready = self._ready_by(at, shape, members)
        if len(ready) < shape.nodes:  # cannot happen: ``where`` is among them
            return at, where
        return at, self._same_block(ready, shape.nodes)

    def _ready_by(self, at: float, shape: Shape, members: frozenset[int]
                  ) -> list[tuple[int, str]]:
        """Every member node (and the kind it would use) where ``shape`` could start at
        ``at`` and run its whole duration: latest ready first, then fewest units free now,
        then by index."""
        best: dict[int, tuple[float, int, int, str]] = {}
        for kind in (self.matching(shape.kinds) if shape.gpus else [""]):
            for reserved in (False, True):
                for ready, index in self._sorted_starts(kind, shape, reserved):
                    if ready > at:
                        break
                    node = self.nodes[index]
                    if index not in members or not self._usable(node, shape) or (
                            reserved and not node.fits(kind, shape, at)):
                        continue
                    key = (-ready, node.count(kind) if kind else node.free_gpus(), index, kind)
                    if index not in best or key < best[index]:
                        best[index] = key
        return [(index, kind) for _, _, index, kind in sorted(best.values())]

    def reserve(self, at: float, where: Sequence[tuple[int, str]], shape: Shape,
                job_id: int = 0) -> None:
        """Hold ``shape`` on these nodes from ``at`` for its duration, for ``job_id``."""
        for index, kind in where:
            self.owners[(index, at)] = job_id
            node = self.nodes[index]
            node.reserved.append((at, at + shape.duration, kind, shape.gpus,
                                  float(shape.cpus), float(shape.mem_mb)))
            self.reserved_nodes.add(index)
            self._touched(index)

    def in_the_way(self, shape: Shape, members: frozenset[int]) -> tuple[str, int, float] | None:
        """A node where ``shape`` has room now but would run into a reservation: the node,
        the reserved job and when its reservation starts (the earliest such)."""
        found: tuple[float, int, int] | None = None
        for index in sorted(self.reserved_nodes & members):
            node = self.nodes[index]
            if not self._usable(node, shape):
                continue
            for kind in (self.matching(shape.kinds) if shape.gpus else [""]):
                if (node.count(kind) < shape.gpus or node.cpus < shape.cpus
                        or node.mem < shape.mem_mb or node.fits(kind, shape, self.now)):
                    continue
                start = min(s for s, *_ in node.reserved if s < self.now + shape.duration)
                if found is None or start < found[0]:
                    found = (start, index, self.owners.get((index, start), 0))
        if found is None:
            return None
        return self.nodes[found[1]].view.name, found[2], found[0]

    def biggest_free(self, members: frozenset[int], shape: Shape) -> tuple[str, int] | None:
        """The member node with the most free units of a kind the shape accepts, and how many."""
        best: tuple[int, int] | None = None
        kinds = self.matching(shape.kinds)
        for index in sorted(members):
            node = self.nodes[index]
            if not self._usable(node, shape):
                continue
            free = max((node.count(kind) for kind in kinds), default=0)
            if best is None or free > best[0]:
                best = (free, index)
        return None if best is None else (self.nodes[best[1]].view.name, best[0])
