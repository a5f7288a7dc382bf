"""One node's free resources over time as a step function: units of each kind, CPUs and
memory on ``[times[k], times[k + 1])``, the last values holding for ever.

``NodeTimeline.fits`` adds up the releases and reservations at every instant it looks
at, so finding a start among a node's reservations costs their square. Here the sums
are made once: running jobs give resources back at their time limits, a reservation
takes them over its interval, and the earliest start for a shape is one forward sweep
that looks at no breakpoint twice (a window that fails at a breakpoint cannot start
before it). A pass keeps one per reserved node and changes it in place as it reserves
there (``take_out``), instead of building it again.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable

from gpusched.core.units import INF

# (time, kind, GPUs, CPUs, memory, job id): what a running job gives back at its end.
Release = tuple[float, str, int, float, float, int]
# (start, end, kind, GPUs, CPUs, memory): what is held for a blocked job.
Held = tuple[float, float, str, int, float, float]


class NodeProfile:
    """Free units by kind, CPUs and memory of one node from ``times[0]`` (the pass's
    present) on; ``version`` names the state of the node it was made from."""

    __slots__ = ("times", "gpus", "cpus", "mem", "version")

    def __init__(self, now: float, counts: dict[str, int], cpus: float, mem: float,
                 releases: Iterable[Release], reserved: Iterable[Held], version: int) -> None:
        """The profile of a node with ``counts`` units free now (by kind), ``cpus`` and
        ``mem`` free now, what its running jobs give back and what is held there."""
        gpus0 = dict(counts)
        changes: list[tuple[float, str, int, float, float]] = []
        for when, kind, g, c, m, _ in releases:
            if when <= now:
                gpus0[kind] = gpus0.get(kind, 0) + g
                cpus += c
                mem += m
            elif when < INF:
                changes.append((when, kind, g, c, m))
        for start, end, kind, g, c, m in reserved:
            if end <= now:
                continue
            if start <= now:
                gpus0[kind] = gpus0.get(kind, 0) - g
                cpus -= c
                mem -= m
            else:
                changes.append((start, kind, -g, -c, -m))
            if end < INF:
                changes.append((end, kind, g, c, m))
        for _, kind, *_ in changes:
            gpus0.setdefault(kind, 0)
        times = [now]
        gpus = {kind: [n] for kind, n in gpus0.items()}
        cpu_list, mem_list = [cpus], [mem]
        changes.sort(key=lambda change: change[0])
        for when, kind, g, c, m in changes:
            if when != times[-1]:
                times.append(when)
                for values in gpus.values():
                    values.append(values[-1])
                cpu_list.append(cpu_list[-1])
                mem_list.append(mem_list[-1])
            gpus[kind][-1] += g
            cpu_list[-1] += c
            mem_list[-1] += m
        self.times, self.gpus, self.cpus, self.mem = times, gpus, cpu_list, mem_list
        self.version = version

    def _split(self, at: float) -> int:
        """The index of the breakpoint at ``at`` (>= the first), made if missing."""
        times = self.times
        k = bisect_left(times, at)
        if k < len(times) and times[k] == at:
            return k
        times.insert(k, at)
        for values in self.gpus.values():
            values.insert(k, values[k - 1])
        self.cpus.insert(k, self.cpus[k - 1])
        self.mem.insert(k, self.mem[k - 1])
        return k

    def take_out(self, start: float, end: float, kind: str, gpus: int, cpus: float,
                 mem: float) -> None:
        """Hold ``gpus`` units of ``kind``, ``cpus`` and ``mem`` over ``[start, end)``."""
        start = max(start, self.times[0])
        if end <= start:
            return
        if kind not in self.gpus:
            self.gpus[kind] = [0] * len(self.times)
        first = self._split(start)
        last = self._split(end) if end < INF else len(self.times)
        units, cpu_list, mem_list = self.gpus[kind], self.cpus, self.mem
        if mem:
            for k in range(first, last):
                units[k] -= gpus
                cpu_list[k] -= cpus
                mem_list[k] -= mem
        else:  # most requests ask for no memory: its list stays as it is
            for k in range(first, last):
                units[k] -= gpus
                cpu_list[k] -= cpus

    def earliest(self, kind: str, gpus: int, cpus: float, mem: float, length: float,
                 after: float = -INF) -> float:
        """The first time (the present or a breakpoint), not before ``after``, from which
        ``gpus`` units of ``kind``, ``cpus`` and ``mem`` are free for ``length``; INF if
        none."""
        times, cpu_list, mem_list = self.times, self.cpus, self.mem
        count = len(times)
        units = self.gpus.get(kind)
        if units is None:
            if gpus > 0:
                return INF
            units = [0] * count
        k = bisect_left(times, after) if after > times[0] else 0
        while k < count:
            if units[k] < gpus or cpu_list[k] < cpus or mem_list[k] < mem:
                k += 1
                continue
            end = times[k] + length
            m = k + 1
            while m < count and times[m] < end:
                if units[m] < gpus or cpu_list[m] < cpus or mem_list[m] < mem:
                    break
                m += 1
            else:
                return times[k]
            k = m + 1  # short at m: no start before it runs past it
        return INF

    def fits(self, kind: str, gpus: int, cpus: float, mem: float, start: float,
             length: float) -> bool:
        """Whether the request fits from ``start`` (>= the present) for ``length``."""
        times = self.times
        units = self.gpus.get(kind)
        k = max(0, bisect_right(times, start) - 1)
        end = start + length
        count = len(times)
        cpu_list, mem_list = self.cpus, self.mem
        while True:
            if (units[k] if units is not None else 0) < gpus or cpu_list[k] < cpus \
                    or mem_list[k] < mem:
                return False
            k += 1
            if k == count or times[k] >= end:
                return True
