"""Nodes in order of when one shape could start on them, kept through a pass.

Within a pass, starts and reservations only take resources away, so a node's earliest
start for a shape only moves later. An entry worked out before its node changed is then
a lower bound, and the order can wait to refresh it until a reader reaches it: the
node's new start is never earlier, so it goes back in at or after the reader's place
(lazy invalidation). A reservation thus costs a refresh only in the orders that look
that far, instead of one in every order kept. Giving resources back early (a
preemption) breaks the bound: the nodes it changed are refreshed at once.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable, Iterable, Iterator

from gpusched.core.units import INF

# A node's earliest start now, given a bound it cannot be before; None when the node has
# left this order's side.
Recompute = Callable[[int, float], "float | None"]


class StartOrder:
    """(earliest start, node) sorted, each node's entry (its start and the node's
    version then), and how far the pass's logs have been read."""

    __slots__ = ("order", "at", "version", "recompute", "joined", "changes", "gave_back")

    def __init__(self, at: dict[int, tuple[float, int]], version: dict[int, int],
                 recompute: Recompute, joined: int = 0, changes: int = 0,
                 gave_back: int = 0, order: list[tuple[float, int]] | None = None) -> None:
        """``at``: each node's start and its version then; ``version`` holds each changed
        node's current version, ``recompute`` works a node's start out again; ``order``,
        when given, is ``at`` as (start, node) sorted, this order's own to change."""
        self.at = at
        self.version, self.recompute = version, recompute
        self.order = order if order is not None else sorted(
            (start, index) for index, (start, _) in at.items())
        self.joined = joined  # nodes reserved since the start of the pass, read
        self.changes = changes  # the change log, read
        self.gave_back = gave_back  # preemptions, seen

    @classmethod
    def of(cls, indexes: Iterable[int], version: dict[int, int], recompute: Recompute,
           joined: int = 0, changes: int = 0, gave_back: int = 0) -> StartOrder:
        """The order of ``indexes``, each worked out now."""
        at: dict[int, tuple[float, int]] = {}
        for index in indexes:
            start = recompute(index, -INF)
            if start is not None:
                at[index] = (start, version.get(index, 0))
        return cls(at, version, recompute, joined, changes, gave_back)

    def redo(self, index: int) -> None:
        """Work node ``index``'s start out again now, if it is in this order."""
        if index in self.at:
            self.refresh(index)

    def add(self, index: int, lower_bound: float) -> None:
        """Node ``index`` joins, to be worked out when a reader reaches it."""
        if index not in self.at:
            self.at[index] = (lower_bound, -1)
            insort(self.order, (lower_bound, index))

    def refresh(self, index: int) -> None:
        """Work node ``index``'s start out again now, earlier or later (or drop it)."""
        old = self.at.pop(index, None)
        if old is not None:
            self.order.remove((old[0], index))
        start = self.recompute(index, -INF)
        if start is not None:
            self.at[index] = (start, self.version.get(index, 0))
            insort(self.order, (start, index))

    def each(self, until: float = INF) -> Iterator[tuple[float, int]]:
        """(start, node) in order up to ``until``, every entry up to date when given. An
        entry whose bound is already past ``until`` ends the walk as it is: what it
        would become is later still."""
        order, at, version = self.order, self.at, self.version
        place = 0
        while place < len(order):
            start, index = order[place]
            if start > until:
                return
            if at[index][1] != version.get(index, 0):
                self._stale(place, start, index)
                continue
            yield start, index
            place += 1

    def first(self, until: float, wanted: Callable[[int], bool]) -> tuple[float, list[int]]:
        """The earliest start of a ``wanted`` node, if not after ``until``, and every
        wanted node that could start then, in order; (INF, []) if none. Reads no further
        than it must: past that start, entries are not worked out again."""
        order, at, current, recompute = self.order, self.at, self.version.get, self.recompute
        best, found = until, []
        place = 0
        while place < len(order):
            start, index = order[place]
            if start > best:
                break
            now = current(index, 0)
            if at[index][1] != now:  # _stale, inline: this is the pass's hottest loop
                fresh = recompute(index, start)
                if fresh is None:
                    del order[place]
                    del at[index]
                    continue
                at[index] = (fresh, now)
                if fresh != start:  # back in order: later (the rule), past its old place
                    del order[place]
                    insort(order, (fresh, index), place if fresh > start else 0)
                    continue
            if start < INF and wanted(index):
                best = start
                found.append(index)
            place += 1
        return (best, found) if found else (INF, found)

    def _stale(self, place: int, start: float, index: int) -> bool:
        """Whether the entry at ``place`` (``start``, ``index``) is out of date; if so it
        is worked out again and put back in order, at or after ``place`` (a start only
        moves later), or dropped when the node can no longer start the shape."""
        now = self.version.get(index, 0)
        if self.at[index][1] == now:
            return False
        del self.order[place]
        fresh = self.recompute(index, start)
        if fresh is None:
            del self.at[index]
        else:
            self.at[index] = (fresh, now)
            insort(self.order, (fresh, index))
        return True
