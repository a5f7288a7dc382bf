"""A node's resources over time as one step function (``NodeProfile``) answer as the
node's own sums do, and the order of nodes by earliest start stays exact when it
refreshes its entries only as it reaches them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.model import GpuView, NodeState, NodeView
from gpusched.core.node_profile import NodeProfile
from gpusched.core.node_timeline import NodeTimeline
from gpusched.core.start_order import StartOrder
from gpusched.core.units import INF, NodeUnits, Shape

KINDS = ("a100", "1g.10gb")
NOW = 100.0


def timeline(free: dict[str, int], cpus: int, releases: list[tuple[float, str, int, int]],
             reserved: list[tuple[float, float, str, int, int]]) -> NodeTimeline:
    """A node with ``free`` units of each kind free now out of 8, ``cpus`` of 64 CPUs
    free, and the releases and reservations given (CPUs as the fourth, fifth field)."""
    gpus = [GpuView(f"{kind}-{n}", i * 8 + n, gpu_type="a100",
                    mig_profile=kind if kind != "a100" else None)
            for i, kind in enumerate(KINDS) for n in range(8)]
    node = NodeTimeline(0, NodeUnits(NodeView("n0", NodeState.UP, tuple(gpus), cpus=64)),
                        {gpu.uuid for gpu in gpus if int(gpu.uuid.rsplit("-", 1)[1])
                         >= free[gpu.uuid.rsplit("-", 1)[0]]})
    node.cpus = float(cpus)
    node.releases = sorted((t, kind, g, float(c), 0.0, -1) for t, kind, g, c in releases)
    node.reserved = [(s, e, kind, g, float(c), 0.0) for s, e, kind, g, c in reserved]
    return node


times = st.sampled_from([NOW - 10, NOW, NOW + 5, NOW + 10, NOW + 20, NOW + 35, NOW + 50,
                         NOW + 80, INF])
kinds = st.sampled_from(KINDS)
release = st.tuples(times, kinds, st.integers(0, 3), st.integers(0, 16))
interval = st.tuples(times, times).map(sorted).filter(lambda se: se[0] < se[1] and se[0] < INF)
held = st.builds(lambda se, kind, g, c: (se[0], se[1], kind, g, c),
                 interval, kinds, st.integers(0, 4), st.integers(0, 24))
nodes = st.builds(timeline,
                  st.fixed_dictionaries({kind: st.integers(0, 8) for kind in KINDS}),
                  st.integers(0, 64), st.lists(release, max_size=6),
                  st.lists(held, max_size=6))
shapes = st.builds(lambda kind, g, c, d: Shape((kind,), g, c, 0, 1, d, 0),
                   kinds, st.integers(0, 8), st.integers(0, 64),
                   st.sampled_from([1.0, 5.0, 10.0, 30.0, 60.0, INF]))


def profile_of(node: NodeTimeline) -> NodeProfile:
    return NodeProfile(NOW, {kind: len(units) for kind, units in node.free.items()},
                       node.cpus, node.mem, node.releases, node.reserved, 0)


@settings(max_examples=400, deadline=None)
@given(nodes, shapes, times)
def test_the_profile_answers_as_the_node(node: NodeTimeline, shape: Shape, at: float) -> None:
    profile = profile_of(node)
    kind = shape.kinds[0]
    first = node.earliest(kind, shape, NOW)
    assert profile.earliest(kind, shape.gpus, shape.cpus, shape.mem_mb, shape.duration) == first
    if first < INF:  # a bound at or before the answer finds it again
        for bound in (NOW, first, (NOW + first) / 2):
            assert profile.earliest(kind, shape.gpus, shape.cpus, shape.mem_mb,
                                    shape.duration, bound) == first
    if at >= NOW and at < INF:
        assert profile.fits(kind, shape.gpus, shape.cpus, shape.mem_mb, at, shape.duration) \
            == node.fits(kind, shape, at)


@settings(max_examples=300, deadline=None)
@given(nodes, st.lists(held, min_size=1, max_size=5), shapes)
def test_a_profile_followed_through_reservations_equals_one_made_again(
        node: NodeTimeline, more: list[tuple[float, float, str, int, int]], shape: Shape) -> None:
    followed = profile_of(node)
    for start, end, kind, g, c in more:
        followed.take_out(start, end, kind, g, float(c), 0.0)
        node.reserved.append((start, end, kind, g, float(c), 0.0))
    again = profile_of(node)
    kind = shape.kinds[0]
    args = (kind, shape.gpus, shape.cpus, shape.mem_mb, shape.duration)
    assert followed.earliest(*args) == again.earliest(*args) == node.earliest(kind, shape, NOW)
    for at in (NOW, NOW + 7, NOW + 20, NOW + 50):
        assert followed.fits(kind, shape.gpus, shape.cpus, 0, at, shape.duration) \
            == again.fits(kind, shape.gpus, shape.cpus, 0, at, shape.duration)


def test_a_window_cut_short_by_a_reservation_starts_after_it() -> None:
    # 4 units now; 3 held over [110, 130), 8 back at 140: a 2-unit job for 20 s cannot
    # run from now (it would meet the hold at 110) nor during the hold; it starts at 130.
    node = timeline({"a100": 4, "1g.10gb": 0}, 64, [(NOW + 40, "a100", 4, 0)],
                    [(NOW + 10, NOW + 30, "a100", 3, 0)])
    shape = Shape(("a100",), 2, 0, 0, 1, 20.0, 0)
    assert profile_of(node).earliest("a100", 2, 0, 0, 20.0) == NOW + 30
    assert node.earliest("a100", shape, NOW) == NOW + 30
    assert profile_of(node).earliest("a100", 1, 0, 0, 20.0) == NOW


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=30),
       st.lists(st.tuples(st.integers(0, 29), st.integers(0, 30), st.integers(0, 12)),
                max_size=40))
def test_the_order_refreshed_as_read_is_the_order_made_again(
        starts: list[int], changes: list[tuple[int, int, int]]) -> None:
    """Nodes' starts only move later; after each batch of changes, reading the first
    ``k`` entries gives exactly the first ``k`` of a fresh sort."""
    true = {index: float(t) for index, t in enumerate(starts)}
    version = {index: 0 for index in true}

    def recompute(index: int, bound: float) -> float:
        assert bound <= true[index]  # the stale entry was a lower bound
        return true[index]

    order = StartOrder.of(true, version, recompute)

    for index, later, k in changes:
        if index in true:
            true[index] += later
            version[index] += 1
        read = []
        for entry in order.each():
            if len(read) == k:
                break
            read.append(entry)
        assert read == sorted((t, i) for i, t in true.items())[:k]
        until = float(k * 4)
        assert list(order.each(until)) == sorted(
            (t, i) for i, t in true.items() if t <= until)
    assert list(order.each()) == sorted((t, i) for i, t in true.items())
    odd = {index for index in true if index % 2}
    best = min((t for i, t in true.items() if i in odd), default=INF)
    assert order.first(INF, odd.__contains__) == (
        best, sorted(i for i, t in true.items() if i in odd and t == best))
