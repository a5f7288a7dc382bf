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
from collections.abc import Callable, Iterator

# A node's earliest start now, or None when it has left this order's side.
Recompute = Callable[[int], "float | None"]


class StartOrder:
    """(earliest start, node) sorted, each node's entry (its start and the node's
    version then), and how far the pass's logs have been read."""

    __slots__ = ("order", "at", "joined", "changes", "gave_back")

    def __init__(self, at: dict[int, tuple[float, int]], joined: int, changes: int,
                 gave_back: int) -> None:
        self.at = at
        self.order = sorted((start, index) for index, (start, _) in at.items())
        self.joined = joined  # nodes reserved since the start of the pass, read
        self.changes = changes  # the change log, read
        self.gave_back = gave_back  # preemptions, seen

    def add(self, index: int, lower_bound: float) -> None:
        """Node ``index`` joins, to be worked out when a reader reaches it."""
        if index not in self.at:
            self.at[index] = (lower_bound, -1)
            insort(self.order, (lower_bound, index))

    def replace(self, index: int, start: float | None, version: int) -> None:
        """Node ``index``'s start is now exactly ``start`` (None: it leaves)."""
        old = self.at.pop(index, None)
        if old is not None:
            self.order.remove((old[0], index))
        if start is not None:
            self.at[index] = (start, version)
            insort(self.order, (start, index))

    def each(self, version: dict[int, int], recompute: Recompute) -> Iterator[tuple[float, int]]:
        """(start, node) in order, every entry up to date when given; ``version`` holds
        each changed node's current version, ``recompute`` works one out again."""
        order, at = self.order, self.at
        place = 0
        while place < len(order):
            start, index = order[place]
            now = version.get(index, 0)
            if at[index][1] != now:
                del order[place]
                fresh = recompute(index)
                if fresh is None:
                    del at[index]
                else:
                    at[index] = (fresh, now)
                    insort(order, (fresh, index))  # at or after ``place``: never earlier
                continue
            yield start, index
            place += 1
