"""A ``NodeProfile`` followed through reservations that hold memory (and ones that hold
none) answers as one made again from the node's reservations, memory included."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.node_profile import NodeProfile
from gpusched.core.units import INF

NOW = 100.0
times = st.sampled_from([NOW, NOW + 5, NOW + 10, NOW + 20, NOW + 35, NOW + 50, INF])
held = st.tuples(times, times).map(sorted).filter(lambda se: se[0] < se[1] < INF or (
    se[0] < INF and se[1] == INF)).flatmap(lambda se: st.tuples(
        st.just(se[0]), st.just(se[1]), st.integers(0, 3), st.integers(0, 8),
        st.sampled_from([0.0, 0.0, 100.0, 400.0])))


def made(reserved: list[tuple[float, float, str, int, float, float]]) -> NodeProfile:
    releases = [(NOW + 30, "a100", 2, 8.0, 300.0, -1)]
    return NodeProfile(NOW, {"a100": 4}, 32.0, 1000.0, releases, reserved, 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(held, min_size=1, max_size=6), st.integers(1, 6),
       st.sampled_from([0.0, 200.0, 700.0, 1100.0]), st.sampled_from([1.0, 10.0, 40.0, INF]))
def test_memory_held_is_followed(more: list[tuple[float, float, int, int, float]], gpus: int,
                                 mem: float, length: float) -> None:
    followed = made([])
    reserved: list[tuple[float, float, str, int, float, float]] = []
    for start, end, g, c, m in more:
        followed.take_out(start, end, "a100", g, float(c), m)
        reserved.append((start, end, "a100", g, float(c), m))
    again = made(reserved)
    assert followed.earliest("a100", gpus, 4, mem, length) \
        == again.earliest("a100", gpus, 4, mem, length)
    for at in (NOW, NOW + 7, NOW + 20, NOW + 50):
        assert followed.fits("a100", gpus, 4, mem, at, length) \
            == again.fits("a100", gpus, 4, mem, at, length)
