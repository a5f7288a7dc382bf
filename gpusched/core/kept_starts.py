"""Nodes in order of when one shape could start on them, kept by an occupancy that is
kept between passes, so that a pass needs not work out every node again.

On a node without reservations resources only come back as time goes on, so when a
shape could start there is ``max(now, ready)``: ``ready`` is the first moment (-INF
for at once) from which the node's free units, CPUs and memory, with what its running
jobs give back until then, hold the shape. ``ready`` does not depend on the present.
For each shape asked, the occupancy keeps every node with enough units of the kind in
order of (ready, index); a start or an end marks the nodes it changed, and those alone
are worked out again, when the order is next asked for.

A pass copies the order (``StartOrder.kept``): it takes the nodes its own starts and
reservations changed as out of date, which the order works out again when a reader
reaches them (their kept entry is a lower bound: the pass only took resources away).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence

from gpusched.core.node_timeline import NodeTimeline
from gpusched.core.units import INF, Shape

# (kind, GPUs, CPUs, memory): what decides when a shape could start on a free node.
Key = tuple[str, int, int, int]

# Kept orders at most, and the part of an order's nodes changed since it was read past
# which it is made again from nothing when next asked for (else it is dropped now).
MOST_KEPT = 16


class KeptOrder:
    """One shape's nodes sorted by (ready, index), and what has changed since."""

    __slots__ = ("order", "ready", "dirty", "shape", "kind")

    def __init__(self, kind: str, shape: Shape, nodes: Sequence[NodeTimeline]) -> None:
        self.kind, self.shape = kind, shape
        gpus = shape.gpus
        # node -> (ready, 0): as a pass's StartOrder holds it (version 0: unchanged).
        self.ready: dict[int, tuple[float, int]] = {}
        for node in nodes:
            if not kind or node.total.get(kind, 0) >= gpus:
                self.ready[node.index] = (node.earliest(kind, shape, -INF), 0)
        self.order = sorted((at, index) for index, (at, _) in self.ready.items())
        self.dirty: set[int] = set()

    def update(self, nodes: Sequence[NodeTimeline]) -> None:
        """Work out again the nodes changed since the order was last read."""
        ready, order, kind, shape = self.ready, self.order, self.kind, self.shape
        for index in self.dirty:
            old = ready.get(index)
            if old is None:
                continue  # too few units of the kind: never in this order
            new = nodes[index].earliest(kind, shape, -INF)
            if new != old[0]:
                del order[bisect_left(order, (old[0], index))]
                insort(order, (new, index))
                ready[index] = (new, 0)
        self.dirty.clear()


class KeptStarts:
    """The orders an occupancy keeps, by shape key, most recently asked last."""

    def __init__(self) -> None:
        self.kept: dict[Key, KeptOrder] = {}

    def changed(self, indexes: Iterable[int], count: int) -> None:
        """These nodes (of ``count`` usable ones) changed: mark them in every order; an
        order with more than half its nodes out of date is dropped."""
        indexes = list(indexes)
        for key, kept in list(self.kept.items()):
            kept.dirty.update(indexes)
            if 2 * len(kept.dirty) > count:
                del self.kept[key]

    def clear(self) -> None:
        """Every node changed (the occupancy was made again)."""
        self.kept.clear()

    def order(self, kind: str, shape: Shape, nodes: Sequence[NodeTimeline]) -> KeptOrder:
        """The order of every node with enough units of ``kind`` for ``shape``, up to
        date; kept, not to be changed."""
        key = (kind, shape.gpus, shape.cpus, shape.mem_mb)
        kept = self.kept.pop(key, None)
        if kept is None:
            kept = KeptOrder(kind, shape, nodes)
            if len(self.kept) >= MOST_KEPT:
                del self.kept[next(iter(self.kept))]
        elif kept.dirty:
            kept.update(nodes)
        self.kept[key] = kept
        return kept


def as_of(kept: KeptOrder, now: float,
          ) -> tuple[list[tuple[float, int]], dict[int, tuple[float, int]]] | None:
    """A kept order as a pass at ``now`` sees it: (start, node) sorted, and each node's
    (start, version 0), both copies; None when a node's ready time lies between -INF and
    ``now`` (never in a replay: what ended by now has been taken out), as then the order
    of the nodes that could start at once is not the kept one."""
    order = kept.order
    free = bisect_left(order, (-INF, INF))
    if free < len(order) and order[free][0] <= now:
        return None
    starts = [(now, index) for _, index in order[:free]]
    starts.extend(order[free:])
    at = dict(kept.ready)
    for _, index in starts[:free]:
        at[index] = (now, 0)
    return starts, at
