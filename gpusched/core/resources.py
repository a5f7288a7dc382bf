"""The free resources of the usable nodes during one pass, shared by matching, the
timeline and preemption: each node's state, the buckets best fit walks, the nodes held
whole or reserved, and the caches a pass keeps (all forgotten by ``advance``).

A pass starts from an ``Occupancy`` (what the running jobs hold): its own, or one kept
between passes, whose nodes it copies only as it changes them (``_own``).

Nodes sit in buckets by how many units of each kind they have free, so best fit walks
buckets upward instead of scanning every node.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Collection, Iterable

from gpusched.core.model import NodeView, RunningJob
from gpusched.core.node_profile import NodeProfile
from gpusched.core.node_timeline import NodeTimeline
from gpusched.core.occupancy import (
    Occupancy,
    copy_all,
    copy_node,
    hold_whole,
    own_units,
    releases_of,
)
from gpusched.core.start_order import StartOrder
from gpusched.core.units import INF, Shape, kind_matches


class PassResources:
    """The resources of the usable nodes during one pass."""

    def __init__(self, nodes: Iterable[NodeView], running: Iterable[RunningJob],
                 now: float, occupancy: Occupancy | None = None) -> None:
        self.now = now
        # A kept occupancy is shared: this pass copies a node before changing it. Else
        # the occupancy is built for this pass alone, and its nodes are the pass's own.
        occupied = Occupancy(nodes, running) if occupancy is None else occupancy
        known = self.inventory = occupied.inventory
        self.index = known.index
        self.kind_of = known.kind_of
        self.kinds = known.kinds
        self.slice_kinds = known.slice_kinds
        self.most = known.most
        self.restricted = known.restricted
        self.blocks = known.blocks  # whether any node is in a topology block
        # A kept occupancy, as of the change it had been told of (its start orders serve
        # this pass).
        self._kept = occupancy if occupancy is not None and occupancy.kept else None
        self._kept_seen = occupied.generation
        if occupancy is None:
            self.nodes = occupied.nodes
            self._owned: set[int] | None = None
            self._units_owned: set[int] | None = None
            self.on_node = occupied.on_node
            self.whole = occupied.whole  # nodes an exclusive job holds whole
            # buckets[kind][n]: the nodes with exactly n free units of kind, sorted.
            self.buckets = occupied.buckets
            self._buckets_owned: set[tuple[str, int]] | None = None
        else:
            self.nodes = list(occupied.nodes)
            self._owned = set()
            self._units_owned = set()
            self.on_node = dict(occupied.on_node)
            self.whole = set(occupied.whole)
            # The kept occupancy's buckets, each copied only when this pass first changes
            # it (_bucket): a pass costs the buckets it changes, not all of them.
            self.buckets = dict(occupied.buckets)
            self._buckets_owned = set()
        self.started: set[int] = set()  # nodes a job started on in this pass
        self.reserved_nodes: set[int] = set()
        self.owners: dict[tuple[int, float], int] = {}  # (node, start) -> the reserved job
        self._matching: dict[tuple[str, ...], list[str]] = {}
        self._failed: dict[tuple[object, ...], list[tuple[int, int, int, float]]] = {}
        # Per (reserved?, kind, gpus, cpus, mem, duration): the nodes in order of earliest start.
        self._starts: dict[tuple[bool, str, int, int, int, float], StartOrder] = {}
        self._changed: list[int] = []  # nodes changed by a start or a reservation, in order
        self._version: dict[int, int] = {}  # node -> its last place in the change log
        self._profiles: dict[int, NodeProfile] = {}  # reserved node -> its resources over time
        self._reserved_order: list[int] = []  # nodes in the order they were first reserved
        self.preempted: set[int] = set()  # running jobs this pass decided to stop
        # (group, shape) -> (start, the nodes it is on, change log seen, preemptions seen)
        self._estimates: dict[tuple[object, object], tuple[float, frozenset[int], int, int]] = {}
        self._gave_back = 0  # preemptions so far: they bring resources back earlier

    def _own(self, index: int) -> NodeTimeline:
        """Node ``index``, to change its reservations, CPUs or memory (or to replace its
        releases): first copied when it belongs to a kept occupancy, whose free units
        and releases it still shares (``_own_units`` to change those)."""
        owned = self._owned
        if owned is None or index in owned:
            return self.nodes[index]
        owned.add(index)
        node = self.nodes[index] = copy_node(self.nodes[index])
        return node

    def _own_units(self, index: int) -> NodeTimeline:
        """Node ``index``, to change anything of it, its free units and releases too."""
        units_owned, owned = self._units_owned, self._owned
        if units_owned is None or owned is None or index in units_owned:
            return self.nodes[index]
        units_owned.add(index)
        if index in owned:
            return own_units(self.nodes[index])
        owned.add(index)
        node = self.nodes[index] = copy_all(self.nodes[index])
        return node

    def _bucket(self, kind: str, count: int) -> list[int]:
        """The bucket of nodes with ``count`` free units of ``kind``, to change: this
        pass's own (copied from a kept occupancy's the first time)."""
        owned = self._buckets_owned
        if owned is not None and (kind, count) not in owned:
            if (kind, -1) not in owned:  # the list of the kind's buckets, once
                self.buckets[kind] = list(self.buckets[kind])
                owned.add((kind, -1))
            self.buckets[kind][count] = list(self.buckets[kind][count])
            owned.add((kind, count))
        return self.buckets[kind][count]

    def _hold_whole(self, index: int, end: float | None) -> None:
        """Hold what is still free on node ``index`` for an exclusive job until ``end``
        (None: for good): nothing else starts or is planned there before."""
        node = self._own_units(index)
        self.whole.add(index)
        for kind, free in node.free.items():
            if free:
                self._bucket(kind, len(free)).remove(index)
                insort(self._bucket(kind, 0), index)
        hold_whole(node, INF if end is None else end)
        self._touched(index)

    def _idle(self, index: int) -> bool:
        """Whether nothing runs on node ``index`` and nothing has started there."""
        node = self.nodes[index]
        return (index not in self.whole and index not in self.started
                and not self.on_node.get(index)
                and all(len(node.free.get(kind, ())) == n for kind, n in node.total.items())
                and node.cpus == (node.view.cpus or INF)
                and node.mem == (node.view.memory_mb or INF))

    def _add_releases(self, job: RunningJob, end: float) -> None:
        """Record when ``job`` gives back its GPUs, CPUs and memory, on each of its nodes."""
        for index, release in releases_of(job, end, self.index, self.kind_of):
            insort(self._own_units(index).releases, release)

    def advance(self, now: float) -> None:
        """Move this capacity's present to ``now`` (later), nothing else having changed:
        what was worked out for the earlier present is forgotten."""
        self.now = now
        self._failed.clear()
        self._starts.clear()
        self._estimates.clear()
        self._profiles.clear()

    def _touched(self, index: int) -> None:
        self._changed.append(index)
        self._version[index] = len(self._changed)

    # -- which nodes may run a shape ------------------------------------------------
    def matching(self, wanted: tuple[str, ...]) -> list[str]:
        """The kinds in this cluster that satisfy a request for ``wanted``."""
        found = self._matching.get(wanted)
        if found is None:
            found = [k for k in self.kinds if kind_matches(k, k in self.slice_kinds, wanted)]
            self._matching[wanted] = found
        return found

    def _usable(self, node: NodeTimeline, shape: Shape) -> bool:
        run_uid = node.view.run_uid
        return run_uid is None or run_uid == shape.uid

    def _fits_now(self, node: NodeTimeline, kind: str, shape: Shape) -> bool:
        if node.index in self.reserved_nodes:
            return self._held_fits_now(node, kind, shape)
        return (node.count(kind) >= shape.gpus and node.cpus >= shape.cpus
                and node.mem >= shape.mem_mb)

    def _held_fits_now(self, node: NodeTimeline, kind: str, shape: Shape) -> bool:
        """``node.fits(kind, shape, now)`` for a node holding reservations: read from its
        profile when that is current (a bisection instead of adding up every
        reservation at each one's start)."""
        profile = self._profiles.get(node.index)
        if profile is not None and profile.version == self._version.get(node.index, 0):
            return profile.fits(kind, shape.gpus, shape.cpus, shape.mem_mb, self.now,
                                shape.duration)
        return node.fits(kind, shape, self.now)

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

    def _same_block_one(self, keyed: Collection[tuple[int, int, str]]) -> tuple[int, str]:
        """``_same_block`` of one node, given (key, index, kind) entries unsorted (best:
        the lowest): the best entry of the tightest block (fewest of these nodes, then
        the one whose best entry comes first), or the best of all when none has a block."""
        blocks: dict[str, tuple[int, tuple[int, int, str]]] = {}
        for entry in keyed:
            block = self.nodes[entry[1]].view.block
            if block is not None:
                known = blocks.get(block)
                blocks[block] = (1, entry) if known is None else (
                    known[0] + 1, min(known[1], entry))
        chosen = min(blocks.values())[1] if blocks else min(keyed)
        return chosen[1], chosen[2]
