"""A kept occupancy, told of starts and ends, is what a fresh one built from the running
jobs would be; a pass over it changes only its own copies; and replays that keep one
decide exactly as replays that set every pass up from nothing."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.model import (
    GpuView,
    NodeState,
    NodeView,
    PartitionView,
    RunningJob,
    Snapshot,
)
from gpusched.core.node_timeline import NodeTimeline
from gpusched.core.occupancy import COPIED_SLOTS, Occupancy, copy_node, own_units
from gpusched.core.plan import SchedulingPass, queue_order
from gpusched.sim.cluster import SimCluster, node_view, uniform
from gpusched.sim.replay import SimPolicy, job_shape, simulate
from gpusched.sim.traces import TraceJob


def node_state(node: NodeTimeline) -> tuple[Any, ...]:
    return (node.index, node.view.name, {k: [g.uuid for g in v] for k, v in node.free.items()},
            node.cpus, node.mem, list(node.releases), list(node.reserved))


def state(occupancy: Occupancy) -> tuple[Any, ...]:
    return ([node_state(n) for n in occupancy.nodes],
            {i: [j.job_id for j in jobs] for i, jobs in occupancy.on_node.items()},
            sorted(occupancy.whole), occupancy.buckets)


def cluster_nodes() -> tuple[NodeView, ...]:
    """Three sizes of node, CPUs and memory counted on some, one unhealthy GPU."""
    nodes = [node_view(f"a{i}", 4, "a100", cpus=32, memory_mb=1000) for i in range(3)]
    nodes += [node_view(f"h{i}", 2, "h100") for i in range(2)]
    sick = node_view("s0", 3, "a100")
    gpus = (GpuView(sick.gpus[0].uuid, 0, healthy=False, gpu_type="a100"), *sick.gpus[1:])
    nodes.append(NodeView("s0", NodeState.UP, gpus))
    return tuple(nodes)


NODES = cluster_nodes()


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, RunningJob]]:
    """Starts and ends of jobs that never hold the same GPU twice at once."""
    free = {n.name: [g.uuid for g in n.gpus] for n in NODES}
    running: dict[int, RunningJob] = {}
    steps: list[tuple[str, RunningJob]] = []
    for job_id in range(1, draw(st.integers(1, 25)) + 1):
        if running and draw(st.booleans()):
            ended = running.pop(draw(st.sampled_from(sorted(running))))
            for uuid in ended.gpu_uuids:
                free[next(n.name for n in NODES if uuid in {g.uuid for g in n.gpus})].append(uuid)
            steps.append(("end", ended))
        names = draw(st.lists(st.sampled_from([n.name for n in NODES]), min_size=1, max_size=3,
                              unique=True))
        per = draw(st.integers(0, 2))
        if any(len(free[name]) < per for name in names):
            continue
        uuids = tuple(u for name in names for u in free[name][:per])
        for name in names:
            del free[name][:per]
        job = RunningJob(job_id, names[0], uuids, end_time=draw(st.sampled_from([None, 50.0, 90.0])),
                         cpus=draw(st.sampled_from([0, 4])), mem_mb=draw(st.sampled_from([0, 100])),
                         nodes=tuple(names) if len(names) > 1 else (),
                         exclusive=draw(st.sampled_from([False, False, False, True])))
        running[job_id] = job
        steps.append(("start", job))
    return steps


@settings(max_examples=200, deadline=None)
@given(histories())
def test_a_kept_occupancy_told_of_starts_and_ends_is_a_fresh_one(
        steps: list[tuple[str, RunningJob]]) -> None:
    kept = Occupancy.kept_for(NODES)
    running: dict[int, RunningJob] = {}
    for what, job in steps:
        if what == "start":
            kept.add(job)
            running[job.job_id] = job
        else:
            kept.remove(job)
            del running[job.job_id]
        assert state(kept) == state(Occupancy(NODES, running.values()))


def test_a_copied_node_has_every_slot_and_containers_of_its_own() -> None:
    assert COPIED_SLOTS == set(NodeTimeline.__slots__)
    node = Occupancy(NODES, ()).nodes[0]
    node.releases.append((5.0, "a100", 1, 0.0, 0.0, 3))
    copy = copy_node(node)
    assert node_state(copy) == node_state(node)
    assert copy.reserved is not node.reserved
    own_units(copy)
    assert node_state(copy) == node_state(node)
    assert copy.free["a100"] is not node.free["a100"] and copy.free is not node.free
    assert copy.releases is not node.releases


def test_a_kept_occupancy_refuses_a_job_twice_and_an_unknown_end() -> None:
    kept = Occupancy.kept_for(NODES)
    job = RunningJob(1, "a0", (NODES[0].gpus[0].uuid,), end_time=10.0)
    kept.add(job)
    with pytest.raises(ValueError, match="already running"):
        kept.add(job)
    with pytest.raises(ValueError, match="not running"):
        kept.remove(RunningJob(2, "a0", ()))
    with pytest.raises(ValueError, match="only a kept occupancy"):
        Occupancy(NODES, ()).add(job)


@pytest.mark.parametrize("changed", [False, True])
def test_the_nodes_of_a_kept_occupancy_refuse_changes(changed: bool) -> None:
    kept = Occupancy.kept_for(NODES)
    if changed:  # a node put in place by a start and an end
        kept.add(RunningJob(1, "a0", (NODES[0].gpus[0].uuid,), end_time=10.0, cpus=2))
        kept.add(RunningJob(2, "a0", (NODES[0].gpus[1].uuid,), end_time=20.0, cpus=2))
        kept.remove(RunningJob(1, "a0", (NODES[0].gpus[0].uuid,), end_time=10.0, cpus=2))
    node = kept.nodes[0]
    with pytest.raises(TypeError, match="shared between passes"):
        node.reserved.append((0.0, 1.0, "a100", 1, 0.0, 0.0))
    with pytest.raises(TypeError, match="shared between passes"):
        node.releases.insert(0, (1.0, "a100", 1, 0.0, 0.0, 7))
    with pytest.raises(TypeError, match="shared between passes"):
        node.free["a100"] = []
    with pytest.raises(TypeError, match="shared between passes"):
        node.free["a100"].pop()


@pytest.mark.parametrize("backfill", ["none", "easy", "conservative"])
def test_a_pass_over_a_kept_occupancy_leaves_it_as_it_was(backfill: str) -> None:
    """A busy cluster and a queue that starts some jobs and reserves for others: the
    pass decides as one set up from nothing, and the occupancy is unchanged."""
    cluster = uniform(4, 4)
    running = (RunningJob(1, "node01", tuple(g.uuid for g in cluster.nodes[0].gpus[:3]),
                          end_time=100.0),
               RunningJob(2, "node02", tuple(g.uuid for n in cluster.nodes[1:3] for g in n.gpus),
                          end_time=50.0, nodes=("node02", "node03")))
    kept = Occupancy.kept_for(cluster.nodes, running)
    before = state(kept)
    pending = tuple(job_shape(TraceJob(i, float(i), 10.0, limit, gpus), 4, "sim")
                    for i, (gpus, limit) in enumerate([(1, 20), (8, 30), (4, 500), (2, 40),
                                                       (1, 10)], start=10))
    snapshot = Snapshot(nodes=cluster.nodes, partitions=cluster.partitions, pending=pending,
                        running=running)
    policy = SimPolicy(backfill=backfill).core()
    order = queue_order(snapshot, 20.0, policy)
    fresh = SchedulingPass(snapshot, 20.0, policy).run(order)
    over_kept = SchedulingPass(snapshot, 20.0, policy, occupancy=kept).run(order)
    assert over_kept == fresh
    # the pass did change its nodes
    assert fresh.starts and (backfill == "none" or fresh.reservations)
    assert state(kept) == before


def _workload(draw: st.DrawFn) -> list[TraceJob]:
    jobs, at = [], 0.0
    for job_id in range(1, draw(st.integers(3, 30)) + 1):
        at += draw(st.sampled_from([0.0, 0.0, 1.0, 3.0, 10.0]))
        limit = draw(st.sampled_from([5, 10, 20, 40, 100]))
        run = draw(st.sampled_from([limit, limit // 2, limit + 5, 1]))
        jobs.append(TraceJob(job_id, at, float(run), limit,
                             draw(st.sampled_from([1, 1, 2, 3, 4, 6, 8, 12])),
                             cpus=draw(st.sampled_from([0, 0, 8, 40])),
                             mem_mb=draw(st.sampled_from([0, 0, 500]))))
    return jobs


MIXED_NODES = tuple([node_view(f"b{i}", 8, cpus=64, memory_mb=4000) for i in range(2)]
                    + [node_view(f"s{i}", 2, cpus=16, memory_mb=1000) for i in range(3)]
                    + [node_view(f"o{i}", 1) for i in range(3)])
MIXED = SimCluster(MIXED_NODES, (PartitionView("sim", tuple(n.name for n in MIXED_NODES)),),
                   "sim")


POLICIES = [SimPolicy(backfill=b, kill=k) for b in ("none", "easy", "conservative")
            for k in (True, False)]


def test_conservative_starts_nothing_on_a_node_whose_job_overran_its_limit() -> None:
    """Without kills a job runs past its limit: its 1-GPU nodes count as due to be free
    from now in the unit pools' profile, but nothing starts there until it has ended."""
    jobs = ([TraceJob(1, 0.0, 5.0, 5, 1), TraceJob(2, 0.0, 10.0, 5, 6)]
            + [TraceJob(i, 0.0, 5.0, 5, 1) for i in range(3, 16)]
            + [TraceJob(16, 1.0, 5.0, 5, 1), TraceJob(17, 4.0, 5.0, 5, 1),
               TraceJob(18, 7.0, 5.0, 5, 1)]
            + [TraceJob(i, 10.0, 5.0, 5, 1) for i in range(19, 23)])
    policy = SimPolicy(backfill="conservative", kill=False)
    slow = simulate(jobs, uniform(6, 1), policy, shortcuts=False)
    assert slow.records == simulate(jobs, uniform(6, 1), policy).records
    by_id = {r.job_id: r for r in slow.records}
    assert all(r.gpus == 1 for i, r in by_id.items() if i != 2)
    assert by_id[2].start == 5.0 and by_id[2].end == 15.0  # overran its limit of 5 s
    # no job shares a GPU with another running at the same time
    for a in slow.records:
        for b in slow.records:
            if a.job_id < b.job_id and set(a.gpu_uuids) & set(b.gpu_uuids):
                assert a.end <= b.start or b.end <= a.start, (a, b)


@settings(max_examples=80, deadline=None)
@given(st.composite(_workload)(), st.sampled_from(POLICIES),
       st.sampled_from([uniform(3, 4), uniform(6, 1), MIXED]))
def test_replays_with_shortcuts_decide_as_fresh_passes_do(jobs: list[TraceJob],
                                                          policy: SimPolicy,
                                                          cluster: SimCluster) -> None:
    fast = simulate(jobs, cluster, policy)
    slow = simulate(jobs, cluster, policy, shortcuts=False)
    assert fast.records == slow.records
    assert fast.never == slow.never
    assert fast.passes <= slow.passes
