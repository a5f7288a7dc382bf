"""Choosing one node among the best entries: ``_same_block_one`` (unsorted entries) picks
what ``_same_block`` picks from them sorted, for a count of one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.capacity import Capacity
from gpusched.core.model import GpuView, NodeState, NodeView

BLOCKS = (None, "a", "b", "c")


@given(st.lists(st.sampled_from(BLOCKS), min_size=1, max_size=12),
       st.data())
@settings(max_examples=300, deadline=None)
def test_one_node_of_the_tightest_block(blocks: list[str | None], data: st.DataObject) -> None:
    nodes = tuple(NodeView(f"n{i}", NodeState.UP, (GpuView(f"n{i}-g0", 0),), block=block)
                  for i, block in enumerate(blocks))
    capacity = Capacity(nodes, (), 0.0)
    indexes = data.draw(st.lists(st.integers(0, len(nodes) - 1), min_size=1, unique=True))
    keyed = [(data.draw(st.integers(0, 3)), index, "gpu") for index in indexes]
    ordered = [(index, kind) for _, index, kind in sorted(keyed)]
    assert capacity._same_block_one(keyed) == capacity._same_block(ordered, 1)[0]
