"""Free resources over time: what may start now, and when a blocked job could start.

A pass keeps, for every usable node, its free GPUs (by kind: a GPU type, or a MIG
profile), CPUs and memory now; the times at which running jobs will give resources back
(their time limits); and the reservations made for blocked jobs. Starting a job now must
leave every reservation whole for its whole time limit, which is what makes backfill safe.

``Capacity`` is one pass's view, put together from parts kept apart by idea, as a
matcher is kept apart from a planner:

- ``units``: the inventory of usable units per node, and a job's request (``Shape``);
- ``node_timeline``: one node's resources now, later releases and reservations;
- ``resources``: the state a pass shares, and which nodes may run a shape;
- ``matching``: best-fit placement now, and the failures a pass remembers;
- ``timeline``: earliest starts, estimates and reservations;
- ``preemption``: the running jobs to stop for a job, and stopping them;
- ``probes``: what stands in a waiting job's way, for ``explain``.
"""

from __future__ import annotations

from gpusched.core.matching import MatchingMixin
from gpusched.core.preemption import PreemptionMixin
from gpusched.core.probes import ExplainProbesMixin
from gpusched.core.timeline import TimelineMixin
from gpusched.core.units import (
    INF,
    Inventory,
    Shape,
    any_could_start,
    inventory,
    kind_matches,
)

__all__ = ["INF", "Capacity", "Inventory", "Shape", "any_could_start", "inventory",
           "kind_matches"]


class Capacity(MatchingMixin, TimelineMixin, PreemptionMixin, ExplainProbesMixin):
    """The resources of the usable nodes during one pass."""
