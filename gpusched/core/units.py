"""What a pass is given to place: the usable units of each node, and what a job asks of them.

The inventory of a snapshot's nodes (their healthy units by kind: a GPU type, or a MIG
profile) is built once and reused by every pass given the same nodes. A job's request is
a ``Shape``; ``kind_matches`` says which kinds of unit satisfy it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import accumulate
from typing import NamedTuple

from gpusched.core.model import GpuView, NodeState, NodeView, PartitionView, PendingJob
from gpusched.core.shapes import is_mig_profile

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


def any_could_start_counted(with_free: Sequence[int], shapes: Iterable[tuple[int, int]]) -> bool:
    """``any_could_start`` given ``with_free[n]``, the number of nodes with exactly ``n``
    GPUs free: no sort of every node."""
    at_least = list(accumulate(reversed(with_free)))[::-1]  # nodes with >= n GPUs free
    return any(gpus < len(at_least) and at_least[gpus] >= nodes for gpus, nodes in shapes)


class NodeUnits:
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
        self.nodes = [NodeUnits(view) for view in usable]
        self.index = {view.name: i for i, view in enumerate(usable)}
        self.kind_of: dict[str, tuple[int, str]] = {
            gpu.uuid: (i, gpu.kind) for i, view in enumerate(usable) for gpu in view.gpus}
        self.kinds = sorted({kind for node in self.nodes for kind in node.total})
        self.slice_kinds = {kind for node in self.nodes for kind in node.slices}
        self.most = max((units for node in self.nodes for units in node.total.values()),
                        default=0)
        self.restricted = any(node.view.run_uid is not None for node in self.nodes)
        self.blocks = any(node.view.block is not None for node in self.nodes)
        self._members: tuple[object, dict[str, frozenset[int]]] | None = None

    def members(self, partitions: tuple[PartitionView, ...]) -> dict[str, frozenset[int]]:
        """Each partition's usable nodes, by index; worked out once for the same tuple of
        partitions (a replay gives every pass the same one)."""
        last = self._members
        if last is None or last[0] is not partitions:
            index = self.index
            last = self._members = (partitions, {
                part.name: frozenset(index[n] for n in part.nodes if n in index)
                for part in partitions})
        return dict(last[1])


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
