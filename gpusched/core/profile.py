"""A capacity profile: how many interchangeable units are free over time, as a step
function over sorted breakpoints.

This is the textbook's picture of conservative backfill: running jobs give units back at
their time limits, and each reservation takes units out over its interval. The earliest
time ``u`` units are free for ``d`` seconds is found in one forward sweep that never
looks at a breakpoint twice, and the breakpoint at or before a time by bisection.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable

from gpusched.core.units import INF


class Profile:
    """Free units over time from ``start`` on: ``free[k]`` units on
    ``[times[k], times[k + 1])``, the last value holding for ever."""

    __slots__ = ("times", "free")

    def __init__(self, start: float, free: int, gains: Iterable[float] = ()) -> None:
        """``free`` units at ``start``, and one more at each time of ``gains`` (INF: never)."""
        self.times = [start]
        self.free = [free]
        for at in sorted(t for t in gains if t < INF):
            if at <= start:
                self.free[0] += 1
            elif at == self.times[-1]:
                self.free[-1] += 1
            else:
                self.times.append(at)
                self.free.append(self.free[-1] + 1)

    def _split(self, at: float) -> int:
        """The index of the breakpoint at ``at`` (``at`` >= the start), made if missing."""
        times = self.times
        k = bisect_left(times, at)
        if k < len(times) and times[k] == at:
            return k
        times.insert(k, at)
        self.free.insert(k, self.free[k - 1])
        return k

    def add(self, start: float, end: float, units: int) -> None:
        """Add ``units`` (negative: take them) over ``[start, end)``."""
        start = max(start, self.times[0])
        if end <= start:
            return
        first = self._split(start)
        last = self._split(end) if end < INF else len(self.times)
        free = self.free
        for k in range(first, last):
            free[k] += units

    def at(self, when: float) -> int:
        """Units free at ``when`` (the start's count before it)."""
        return self.free[max(0, bisect_right(self.times, when) - 1)]

    def next_after(self, when: float) -> float:
        """The first breakpoint after ``when``; INF if none."""
        k = bisect_right(self.times, when)
        return self.times[k] if k < len(self.times) else INF

    def earliest(self, units: int, length: float, after: float) -> float:
        """The first time ``s`` >= ``after``, ``after`` itself or a breakpoint, with at
        least ``units`` free throughout ``[s, s + length)``; INF if there is none."""
        times, free = self.times, self.free
        count = len(times)
        k = max(0, bisect_right(times, after) - 1)
        while k < count:
            if free[k] < units:
                k += 1
                continue
            start = times[k] if times[k] > after else after
            end = start + length
            m = k + 1
            while m < count and times[m] < end and free[m] >= units:
                m += 1
            if m == count or times[m] >= end:
                return start
            k = m + 1  # free[m] is short: no start before it can run past it
        return INF
