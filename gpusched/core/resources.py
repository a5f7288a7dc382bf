"""The free resources of the usable nodes during one pass, shared by matching, the
timeline and preemption: each node's state, the buckets best fit walks, the nodes held
whole or reserved, and the caches a pass keeps (all forgotten by ``advance``).

Nodes sit in buckets by how many units of each kind they have free, so best fit walks
buckets upward instead of scanning every node.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable

from gpusched.core.model import NodeView, RunningJob
from gpusched.core.node_timeline import NodeTimeline
from gpusched.core.units import INF, Shape, inventory, kind_matches


class PassResources:
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
        self.nodes = [NodeTimeline(i, units, allocated if i in busy else None)
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
        self._estimates: dict[tuple[object, object], tuple[float, frozenset[int], int, int]] = {}
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
            return node.fits(kind, shape, self.now)
        return (node.count(kind) >= shape.gpus and node.cpus >= shape.cpus
                and node.mem >= shape.mem_mb)

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
