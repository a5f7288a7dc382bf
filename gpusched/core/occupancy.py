"""What the running jobs hold on each usable node, and when they give it back: the state
every pass starts from.

A pass builds one from its snapshot and makes it its own. The simulator instead keeps
one between passes (``Occupancy.kept_for``) and tells it of each job that starts or
ends (``add``, ``remove``), so that a pass costs what it looks at rather than the size
of the cluster. A kept occupancy is shared: its nodes are sealed (changing one raises),
a pass copies a node before it changes it (``PassResources._own``, and ``_own_units``
for its free units and releases), and ``add``/``remove`` replace the nodes they change
instead of changing them, so a pass still running sees the occupancy it started from.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn, TypeVar

from gpusched.core.kept_starts import KeptStarts
from gpusched.core.model import GpuView, NodeView, RunningJob
from gpusched.core.node_timeline import NodeTimeline
from gpusched.core.units import INF, inventory

_T = TypeVar("_T")
_K = TypeVar("_K")
_V = TypeVar("_V")

Release = tuple[float, str, int, float, float, int]


def _shared(*_: Any, **__: Any) -> NoReturn:
    raise TypeError("a node of a kept occupancy is shared between passes: a pass changes "
                    "only its own copy (PassResources._own)")


class SealedList(list[_T]):
    """A list that refuses every change."""

    __slots__ = ()
    append = extend = insert = remove = pop = clear = sort = reverse = _shared
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _shared


class SealedDict(dict[_K, _V]):
    """A dict that refuses every change."""

    __slots__ = ()
    pop = popitem = clear = update = setdefault = _shared
    __setitem__ = __delitem__ = __ior__ = _shared


_NOTHING_RESERVED: SealedList[tuple[float, float, str, int, float, float]] = SealedList()
_NOTHING_RELEASED: SealedList[Release] = SealedList()
_new = object.__new__


# Every slot of a NodeTimeline, as copy_node copies it (a test holds this to __slots__).
COPIED_SLOTS = frozenset({"index", "view", "total", "slices", "free", "cpus", "mem",
                          "releases", "reserved"})


def copy_node(node: NodeTimeline) -> NodeTimeline:
    """A copy of ``node`` with reservations of its own: its free units and releases are
    still ``node``'s until ``own_units`` gives it its own (a reservation needs none)."""
    copy = _new(NodeTimeline)
    copy.index, copy.view, copy.total, copy.slices = node.index, node.view, node.total, node.slices
    copy.free, copy.cpus, copy.mem = node.free, node.cpus, node.mem
    copy.releases = node.releases
    copy.reserved = node.reserved[:]  # a slice: a plain list, also of a sealed one
    return copy


def copy_all(node: NodeTimeline) -> NodeTimeline:
    """``own_units(copy_node(node))`` in one step."""
    copy = _new(NodeTimeline)
    copy.index, copy.view, copy.total, copy.slices = node.index, node.view, node.total, node.slices
    copy.free = {kind: units[:] for kind, units in node.free.items()}
    copy.cpus, copy.mem = node.cpus, node.mem
    copy.releases = node.releases[:]
    copy.reserved = node.reserved[:]
    return copy


def own_units(node: NodeTimeline) -> NodeTimeline:
    """Give ``node`` free units and releases of its own (from a ``copy_node``)."""
    node.free = {kind: units[:] for kind, units in node.free.items()}
    node.releases = node.releases[:]
    return node


def _fresh(old: NodeTimeline) -> NodeTimeline:
    """A new node in place of a kept one, for one change: it shares the old one's sealed
    free units and releases until the change replaces them."""
    node = _new(NodeTimeline)
    node.index, node.view, node.total, node.slices = old.index, old.view, old.total, old.slices
    node.free, node.cpus, node.mem, node.releases = old.free, old.cpus, old.mem, old.releases
    node.reserved = _NOTHING_RESERVED
    return node


def _sealed(node: NodeTimeline) -> NodeTimeline:
    node.free = SealedDict({kind: SealedList(units) for kind, units in node.free.items()})
    node.releases = SealedList(node.releases)
    node.reserved = _NOTHING_RESERVED
    return node


def releases_of(job: RunningJob, end: float, index: dict[str, int],
                kind_of: dict[str, tuple[int, str]]) -> Iterator[tuple[int, Release]]:
    """(node, release) for what ``job`` gives back at ``end`` on each of its nodes: its
    CPUs and memory, and its units of each kind."""
    if end == INF:
        return
    held: dict[tuple[int, str], int] = {}
    for uuid in job.gpu_uuids:
        where = kind_of.get(uuid)
        if where is not None:
            held[where] = held.get(where, 0) + 1
    cpus, mem = float(job.cpus), float(job.mem_mb)
    for name in job.nodes or (job.node,) if cpus or mem else ():
        at = index.get(name)
        if at is not None:
            yield at, (end, "", 0, cpus, mem, job.job_id)
    for (at, kind), count in held.items():
        yield at, (end, kind, count, 0.0, 0.0, job.job_id)


def hold_whole(node: NodeTimeline, until: float) -> None:
    """Hold what is still free on ``node`` until ``until`` (INF: for good) for an
    exclusive job: nothing else starts or is planned there before. The caller moves the
    node to the empty buckets."""
    for kind, free in node.free.items():
        if free:
            if until < INF:
                insort(node.releases, (until, kind, len(free), 0.0, 0.0, -1))
            node.free[kind] = []
    if until < INF and (node.cpus or node.mem):
        insort(node.releases, (until, "", 0, node.cpus, node.mem, -1))
    node.cpus = node.mem = 0.0


class Occupancy:
    """The usable nodes as the running jobs leave them: free units, CPUs and memory,
    releases, the nodes held whole, and the buckets of nodes by free units."""

    def __init__(self, nodes: Iterable[NodeView], running: Iterable[RunningJob]) -> None:
        self.views = nodes
        self.running = list(running)
        known = self.inventory = inventory(nodes)
        self.index = known.index
        self.kind_of = known.kind_of
        self.kept = False
        self._jobs: dict[int, RunningJob] = {}
        self._units_of: dict[int, dict[tuple[int, str], set[str]]] = {}  # by add, for remove
        # Sealed free units, shared by the nodes that have them (nothing changes a sealed
        # one): (node, kind, how many of its units are free) -> the node's free units,
        # kept for none and for all of them.
        self._sealed_free: dict[tuple[int, str, int], dict[str, list[GpuView]]] = {}
        # A kept occupancy's changes: the nodes each start or end changed, in order
        # (the first ``_log_from`` forgotten), and the start orders it keeps.
        self._log: list[int] = []
        self._log_from = 0
        self.starts = KeptStarts()
        self._build()

    @classmethod
    def kept_for(cls, nodes: tuple[NodeView, ...],
                 running: Iterable[RunningJob] = ()) -> Occupancy:
        """An occupancy to keep between passes, told of starts and ends."""
        occupancy = cls(nodes, running)
        occupancy._keep()
        return occupancy

    def _build(self) -> None:
        known, running = self.inventory, self.running
        allocated = {uuid for job in running for uuid in job.gpu_uuids}
        busy = {self.index.get(name) for job in running for name in job.nodes or (job.node,)}
        self.nodes = [NodeTimeline(i, units, allocated if i in busy else None)
                      for i, units in enumerate(known.nodes)]
        self.on_node: dict[int, list[RunningJob]] = {}
        index, kind_of, nodes, on_node = self.index, self.kind_of, self.nodes, self.on_node
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
                for at, release in releases_of(job, job.end_time, index, kind_of):
                    nodes[at].releases.append(release)
        for at in on_node:
            nodes[at].releases.sort()
        self.whole: set[int] = set()  # nodes an exclusive job holds whole
        for job in running:
            if job.exclusive:
                for name in job.nodes or (job.node,):
                    if name in index:
                        self.whole.add(index[name])
                        hold_whole(nodes[index[name]], INF if job.end_time is None
                                   else job.end_time)
        # buckets[kind][n]: indexes of the nodes with exactly n free units of kind, sorted.
        self.buckets: dict[str, list[list[int]]] = {
            kind: [[] for _ in range(known.most + 1)] for kind in known.kinds}
        for node in nodes:
            for kind in node.total:
                self.buckets[kind][node.count(kind)].append(node.index)

    def _keep(self) -> None:
        self.kept = True
        self.nodes = [_sealed(node) for node in self.nodes]
        self._jobs = {job.job_id: job for job in self.running}

    # -- a kept occupancy, told of changes ----------------------------------------------
    def _rebuild(self) -> None:
        self.running = list(self._jobs.values())
        self._build()
        self._keep()
        self._log_from, self._log = self.generation, []
        self.starts.clear()

    @property
    def generation(self) -> int:
        """How many node changes this kept occupancy has been told of."""
        return self._log_from + len(self._log)

    def changed_since(self, generation: int) -> list[int] | None:
        """The nodes changed since ``generation``; None when that is no longer known
        (every node may have changed)."""
        if generation < self._log_from:
            return None
        return self._log[generation - self._log_from:]

    def _whole_involved(self, job: RunningJob) -> bool:
        return job.exclusive or bool(self.whole) and any(
            self.index.get(name) in self.whole for name in job.nodes or (job.node,))

    def _units_by_node(self, job: RunningJob) -> dict[tuple[int, str], set[str]]:
        """The UUIDs of ``job``'s units, by (node, kind) (free units of that kind known)."""
        units: dict[tuple[int, str], set[str]] = {}
        kind_of = self.kind_of
        for uuid in job.gpu_uuids:
            where = kind_of.get(uuid)
            if where is not None:
                known = units.get(where)
                if known is None:
                    units[where] = {uuid}
                else:
                    known.add(uuid)
        return units

    def _replace(self, changed: dict[int, NodeTimeline],
                 moves: list[tuple[str, int, int, int]]) -> None:
        """Put the changed nodes in place and move those whose free units of a kind
        changed, (kind, before, after, node), between buckets: each bucket changed once
        for all the nodes that leave it, and once for those that join it."""
        nodes, buckets = self.nodes, self.buckets
        for at, node in changed.items():
            nodes[at] = node
        if len(moves) == 1:
            kind, before, after, at = moves[0]
            buckets[kind][before].remove(at)
            insort(buckets[kind][after], at)
        elif moves:
            # Nodes that move alike, by (kind, before, after): each node moves once.
            alike: dict[tuple[str, int, int], list[int]] = {}
            for kind, before, after, at in moves:
                key = (kind, before, after)
                group = alike.get(key)
                if group is None:
                    alike[key] = [at]
                else:
                    group.append(at)
            for (kind, before, after), came in alike.items():
                if len(came) == 1:
                    buckets[kind][before].remove(came[0])
                    insort(buckets[kind][after], came[0])
                    continue
                gone = set(came)
                bucket = buckets[kind][before]
                bucket[:] = [at for at in bucket if at not in gone]
                bucket = buckets[kind][after]
                bucket.extend(came)
                bucket.sort()
        log = self._log
        log.extend(changed)
        if len(log) > 4096:  # passes begun that long ago work their orders out anew
            self._log_from += 2048
            del log[:2048]
        self.starts.changed(changed, len(nodes))

    def _free_with(self, node: NodeTimeline, kind: str, units: list[GpuView]
                   ) -> dict[str, list[GpuView]]:
        """``node``'s free units with those of ``kind`` now ``units`` (in inventory
        order); on a node of one kind, none or all of them are shared sealed ones."""
        if len(node.free) != 1 or (units and len(units) != node.total.get(kind)):
            return SealedDict({**node.free, kind: SealedList(units)})
        key = (node.index, kind, len(units))
        known = self._sealed_free.get(key)
        if known is None:
            known = self._sealed_free[key] = SealedDict({kind: SealedList(units)})
        return known

    def add(self, job: RunningJob) -> None:
        """``job`` started: it holds its units, CPUs and memory until its end time."""
        if not self.kept:
            raise ValueError("only a kept occupancy is told of starts and ends")
        job_id = job.job_id
        if job_id in self._jobs:
            raise ValueError(f"job {job_id} is already running")
        self._jobs[job_id] = job
        if self._whole_involved(job):
            self._rebuild()
            return
        changed: dict[int, NodeTimeline] = {}
        nodes, index, on_node = self.nodes, self.index, self.on_node
        # What it gives back at its end, by node (as ``releases_of`` has it).
        end = INF if job.end_time is None else job.end_time
        timed = end != INF
        cpus, mem = job.cpus, job.mem_mb
        freed = timed and bool(cpus or mem)
        added: dict[int, list[Release]] = {}
        for name in job.nodes or (job.node,):
            at = index.get(name)
            if at is not None:
                node = changed.get(at)
                if node is None:
                    node = changed[at] = _fresh(nodes[at])
                node.cpus -= cpus
                node.mem -= mem
                held = on_node.get(at)
                on_node[at] = [*held, job] if held else [job]
                if freed:
                    added.setdefault(at, []).append((end, "", 0, float(cpus), float(mem),
                                                     job_id))
        moves: list[tuple[str, int, int, int]] = []
        units = self._units_of[job_id] = self._units_by_node(job)
        for (at, kind), taken in units.items():
            node = changed.get(at)
            if node is None:
                node = changed[at] = _fresh(nodes[at])
            free = node.free.get(kind)
            if free is not None:
                left = [gpu for gpu in free if gpu.uuid not in taken]
                if len(left) != len(free):
                    node.free = self._free_with(node, kind, left)
                    if kind in node.total:
                        moves.append((kind, len(free), len(left), at))
            if timed:
                release = (end, kind, len(taken), 0.0, 0.0, job_id)
                if at in added:
                    added[at].append(release)
                else:
                    added[at] = [release]
        for at, releases in added.items():
            node = changed[at]
            node.releases = SealedList(sorted([*node.releases, *releases]) if node.releases
                                       else sorted(releases) if len(releases) > 1
                                       else releases)
        self._replace(changed, moves)

    def remove(self, job: RunningJob) -> None:
        """``job`` ended: what it held is free again."""
        if not self.kept:
            raise ValueError("only a kept occupancy is told of starts and ends")
        job_id = job.job_id
        added = self._jobs.pop(job_id, None)
        if added is None:
            raise ValueError(f"job {job_id} is not running")
        units = self._units_of.pop(job_id, None)
        if units is None or added is not job:
            units = self._units_by_node(job)
        if self._whole_involved(job):
            self._rebuild()
            return
        changed: dict[int, NodeTimeline] = {}
        nodes, index, on_node = self.nodes, self.index, self.on_node
        cpus, mem = job.cpus, job.mem_mb
        for name in job.nodes or (job.node,):
            at = index.get(name)
            if at is not None:
                node = changed.get(at)
                if node is None:
                    node = changed[at] = _fresh(nodes[at])
                node.cpus += cpus
                node.mem += mem
                held = on_node.get(at)
                if held is not None and len(held) == 1 and held[0].job_id == job_id:
                    del on_node[at]  # the node's only job: most often
                    continue
                left = [other for other in held or () if other.job_id != job_id]
                if left:
                    on_node[at] = left
                else:
                    on_node.pop(at, None)
        inventory = self.inventory.nodes
        moves: list[tuple[str, int, int, int]] = []
        for (at, kind), returned in units.items():
            node = changed.get(at)
            if node is None:
                node = changed[at] = _fresh(nodes[at])
            now_free = node.free.get(kind)
            if now_free is None:
                continue
            every = inventory[at].units[kind]
            if now_free:
                returned = returned.union(gpu.uuid for gpu in now_free)
            back = [gpu for gpu in every if gpu.uuid in returned]
            if len(back) != len(now_free):
                node.free = self._free_with(node, kind, back)
                if kind in node.total:
                    moves.append((kind, len(now_free), len(back), at))
        for node in changed.values():
            releases = node.releases
            if releases:
                kept = [release for release in releases if release[5] != job_id]
                if len(kept) != len(releases):
                    node.releases = SealedList(kept) if kept else _NOTHING_RELEASED
        self._replace(changed, moves)
