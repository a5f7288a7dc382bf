"""One usable node's resources over time during a pass: what is free now, what running
jobs give back and when (their time limits), and what is held for blocked jobs.

A node with no reservation only gains resources as time goes on, so a job fits there for
its whole time limit exactly when it fits at its start: ``earliest`` then needs one sweep
of the releases.
"""

from __future__ import annotations

from gpusched.core.units import INF, NodeUnits, Shape


class NodeTimeline:
    """One usable node's free resources now, later releases, and reservations."""

    __slots__ = ("index", "view", "free", "cpus", "mem", "releases", "reserved", "total",
                 "slices")

    def __init__(self, index: int, units: NodeUnits, allocated: set[str] | None) -> None:
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
