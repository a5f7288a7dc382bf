"""Probes that say why a job waits: the reservation in its way, and the most units free
on any node it may use. Read-only: they change nothing in the pass.
"""

from __future__ import annotations

from gpusched.core.resources import PassResources
from gpusched.core.units import Shape


class ExplainProbesMixin(PassResources):
    """What stands between a waiting job and the nodes it may use."""

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
