"""``StartOrder.first``, read between changes as a conservative pass reads it, gives the
earliest start of the wanted nodes and every wanted node at that start, as a fresh sort
would, while it refreshes the stale entries it passes: those whose start did not move
(kept in place), those that moved later (put back further on) and those whose node left
the order (dropped)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.start_order import StartOrder
from gpusched.core.units import INF

# (node, how much later it starts (0: touched but unmoved), whether it leaves, the wanted
# nodes' remainder mod 3, the bound read up to (None: no bound))
change = st.tuples(st.integers(0, 24), st.sampled_from([0, 0, 1, 3, 10, 40]),
                   st.booleans(), st.integers(0, 2),
                   st.one_of(st.none(), st.integers(0, 120)))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([0, 0, 5, 10, 20, 30, 50, INF]), min_size=1, max_size=25),
       st.lists(change, max_size=40))
def test_first_between_changes_is_a_fresh_sort(starts: list[float],
                                               changes: list[tuple[int, int, bool, int,
                                                                   int | None]]) -> None:
    true: dict[int, float] = {index: float(t) for index, t in enumerate(starts)}
    gone: set[int] = set()
    version = {index: 0 for index in true}
    asked: list[int] = []

    def recompute(index: int, bound: float) -> float | None:
        asked.append(index)
        if index in gone:
            return None
        assert bound <= true[index]  # the stale entry was a lower bound
        return true[index]

    order = StartOrder.of(true, version, recompute)
    asked.clear()
    for index, later, leaves, rest, bound in changes:
        if index in true and index not in gone:
            if leaves and len(gone) + 1 < len(true):
                gone.add(index)
            else:
                true[index] += later
            version[index] += 1

        def wanted(node: int, rest: int = rest) -> bool:
            return node % 3 != rest

        until = INF if bound is None else float(bound)
        live = {i: t for i, t in true.items() if i not in gone and wanted(i) and t < INF}
        best = min(live.values(), default=INF)
        expect = (best, sorted(i for i, t in live.items() if t == best)) \
            if best <= until else (INF, [])
        assert order.first(until, wanted) == expect
        # The entries it kept stay sorted, each node once, none of a node that left.
        assert order.order == sorted(order.order)
        assert sorted(i for _, i in order.order) == sorted(order.at)
        assert not gone & {i for _, i in order.order if order.at[i][1] == version[i]}
    assert list(order.each()) == sorted((t, i) for i, t in true.items() if i not in gone)
