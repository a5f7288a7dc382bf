"""The replay's test of whether a job could ever run on the cluster (``FitsEver``) asks
one node of each sort; it must answer as the core does when asked about every node."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.capacity import Capacity
from gpusched.core.model import PartitionView, PendingJob
from gpusched.core.units import INF, Shape
from gpusched.sim.cluster import SimCluster, node_view, uniform
from gpusched.sim.replay import FitsEver, SimPolicy, simulate
from gpusched.sim.traces import TraceJob

TYPES = ("a100", "a100-80gb", "h100")


def every_node_says(cluster: SimCluster, pending: PendingJob) -> bool:
    """The core asked about every member node of the empty cluster."""
    capacity = Capacity(cluster.nodes, (), 0.0)
    part = next(p for p in cluster.partitions if p.name == pending.partition)
    if not part.up or (part.max_time is not None and (pending.time_limit or INF) > part.max_time):
        return False
    members = frozenset(capacity.index[n] for n in part.nodes if n in capacity.index)
    return capacity.earliest(Shape.of(pending), members)[0] < INF


@st.composite
def clusters(draw: st.DrawFn) -> SimCluster:
    nodes = []
    for group in range(draw(st.integers(1, 4))):
        gpus = draw(st.integers(1, 8))
        kind = draw(st.sampled_from(TYPES))
        cpus = draw(st.sampled_from([0, 16, 64]))
        mem = draw(st.sampled_from([0, 65536, 524288]))
        run_uid = draw(st.sampled_from([None, None, 0, 5]))
        for i in range(draw(st.integers(1, 4))):
            view = node_view(f"g{group}n{i}", gpus, kind, cpus, mem)
            nodes.append(replace(view, run_uid=run_uid))
    names = tuple(n.name for n in nodes)
    some = tuple(draw(st.lists(st.sampled_from(names), min_size=1, unique=True)))
    parts = (PartitionView("all", names),
             PartitionView("some", some, up=draw(st.booleans()),
                           max_time=draw(st.sampled_from([None, 50, 500]))))
    return SimCluster(tuple(nodes), parts, "all")


jobs = st.builds(
    lambda part, gpus, nodes, cpus, mem, kinds, uid, limit: PendingJob(
        1, part, gpus, uid, 0.0, limit, gpu_kinds=kinds, nodes=nodes, cpus=cpus, mem_mb=mem),
    st.sampled_from(["all", "some"]), st.integers(0, 9), st.integers(1, 6),
    st.sampled_from([0, 8, 16, 40, 64, 100]), st.sampled_from([0, 1000, 70000, 600000]),
    st.sampled_from([(), ("a100",), ("h100",), ("a100-80gb", "h100")]),
    st.sampled_from([0, 5]), st.sampled_from([None, 10, 100, 1000]))


@settings(max_examples=300, deadline=None)
@given(clusters(), st.lists(jobs, min_size=1, max_size=8))
def test_one_node_of_each_sort_answers_as_every_node_does(cluster: SimCluster,
                                                          pendings: list[PendingJob]) -> None:
    fits_ever = FitsEver(cluster)
    for pending in pendings:
        assert fits_ever(pending) == every_node_says(cluster, pending), pending


def test_a_job_wider_than_the_nodes_that_hold_it_never_fits() -> None:
    cluster = SimCluster(
        tuple([node_view(f"big{i}", 8) for i in range(2)] + [node_view("small", 2)]),
        (PartitionView("all", ("big0", "big1", "small")),), "all")
    fits_ever = FitsEver(cluster)
    assert fits_ever(PendingJob(1, "all", 4, 0, 0.0, 10, nodes=2))
    assert not fits_ever(PendingJob(2, "all", 4, 0, 0.0, 10, nodes=3))
    assert fits_ever(PendingJob(3, "all", 2, 0, 0.0, 10, nodes=3))


def test_jobs_that_never_fit_are_left_out_of_a_replay() -> None:
    jobs = [TraceJob(1, 0.0, 5.0, 10, 8), TraceJob(2, 1.0, 5.0, 10, 17), TraceJob(3, 2.0, 5.0, 10, 16)]
    result = simulate(jobs, uniform(2, 8), SimPolicy())
    assert result.never == [2]
    assert [r.job_id for r in result.records] == [1, 3]
