"""Conservative backfill: reservations counted over interchangeable nodes, held per node
elsewhere, and never a node given twice at once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.model import (
    GpuView,
    NodeState,
    NodeView,
    PartitionView,
    PendingJob,
    Plan,
    Policy,
    RunningJob,
    Snapshot,
)
from gpusched.core.plan import plan
from gpusched.core.priority import PriorityWeights
from gpusched.core.profile import Profile
from gpusched.core.units import INF

IN_SUBMIT_ORDER = PriorityWeights(age=0, fairshare=0, job_size=0, partition=0, qos=0)
CONSERVATIVE = Policy(weights=IN_SUBMIT_ORDER, backfill="conservative")


def nodes(count: int, gpus: int = 1, cpus: int = 0) -> list[NodeView]:
    return [NodeView(f"n{i}", NodeState.UP,
                     tuple(GpuView(f"n{i}-g{g}", g) for g in range(gpus)), cpus=cpus)
            for i in range(count)]


def running(job_id: int, on: list[str], end: float, gpus: int = 1) -> RunningJob:
    uuids = tuple(f"{name}-g{g}" for name in on for g in range(gpus))
    return RunningJob(job_id, on[0], uuids, end_time=end, nodes=tuple(on) if len(on) > 1 else ())


def pending(job_id: int, submit: float, count: int, limit: int, gpus: int = 1,
            cpus: int = 0) -> PendingJob:
    return PendingJob(job_id, "all", gpus, 1000, submit, limit, nodes=count, cpus=cpus)


def decide(cluster: list[NodeView], jobs: list[PendingJob], busy: list[RunningJob],
           now: float) -> Plan:
    snapshot = Snapshot(tuple(cluster), (PartitionView("all", tuple(n.name for n in cluster)),),
                        tuple(jobs), tuple(busy))
    return plan(snapshot, now, CONSERVATIVE)


def started(result: Plan) -> dict[int, tuple[str, ...]]:
    return {s.job_id: s.nodes or (s.node,) for s in result.starts}


def reserved(result: Plan) -> dict[int, tuple[float, tuple[str, ...]]]:
    return {r.job_id: (r.start_time, r.nodes) for r in result.reservations}


def test_a_count_of_free_nodes_lets_the_small_job_start_now() -> None:
    # 6 nodes x 1 GPU at t=3: job 1 holds two nodes until 73, job 2 three until 80.
    # Job 3 (4 nodes) can have 80, job 4 (2 nodes for 25) 73 on job 1's nodes, and then
    # the idle node is free until 80 for job 5's 75 seconds. Holding job 3 on named
    # nodes when it was reserved started job 5 at 90.
    cluster = nodes(6)
    busy = [running(1, ["n0", "n1"], 73), running(2, ["n2", "n3", "n4"], 80)]
    jobs = [pending(3, 1, 4, 10), pending(4, 2, 2, 25), pending(5, 3, 1, 75)]
    result = decide(cluster, jobs, busy, 3.0)
    assert started(result) == {5: ("n5",)}
    assert reserved(result) == {3: (80.0, ("n2", "n3", "n4", "n5")), 4: (73.0, ("n0", "n1"))}


def test_a_later_job_never_delays_an_earlier_reservation() -> None:
    # 4 nodes; job 1 holds two until 100. Job 2 needs all four: 100. Job 3 fits now on
    # the two idle nodes but would run into job 2: after it, at 150. Job 4 ends by 100
    # and starts now; job 5 would run one second past 100 on the last idle node: 150.
    cluster = nodes(4)
    busy = [running(1, ["n0", "n1"], 100)]
    jobs = [pending(2, 1, 4, 50), pending(3, 2, 2, 200), pending(4, 3, 1, 100),
            pending(5, 4, 1, 101)]
    result = decide(cluster, jobs, busy, 0.0)
    assert set(started(result)) == {4}
    assert {job: at for job, (at, _) in reserved(result).items()} == {2: 100, 3: 150, 5: 150}
    # The same queue without its last two jobs reserves the first two at the same times.
    shorter = decide(cluster, jobs[:2], busy, 0.0)
    assert {job: at for job, (at, _) in reserved(shorter).items()} == {2: 100, 3: 150}


def test_multi_node_jobs_on_bigger_nodes_are_held_on_named_nodes() -> None:
    # 3 nodes x 8 GPUs: n0 and n1 each have 4 GPUs busy until 50 and 60. Job 1 needs two
    # whole nodes: at 50, on n0 and the idle n2. Job 2 (a whole node for long) would run
    # into that on n2: it gets n1 at 60. Job 3 (4 GPUs, ends by 50) fits beside the
    # running jobs now.
    cluster = nodes(3, gpus=8)
    busy = [RunningJob(90, "n0", tuple(f"n0-g{g}" for g in range(4)), end_time=50),
            RunningJob(91, "n1", tuple(f"n1-g{g}" for g in range(4)), end_time=60)]
    jobs = [pending(1, 1, 2, 100, gpus=8), pending(2, 2, 1, 1000, gpus=8),
            pending(3, 3, 1, 40, gpus=4)]
    result = decide(cluster, jobs, busy, 0.0)
    assert reserved(result) == {1: (50.0, ("n0", "n2")), 2: (60.0, ("n1",))}
    assert set(started(result)) == {3} and started(result)[3][0] in ("n0", "n1")


def test_a_job_asking_for_cpus_waits_for_the_counted_reservations_on_unit_nodes() -> None:
    # 4 nodes x 1 GPU with CPUs. Job 1 holds n0 until 100. Job 2 (4 nodes for 50) is
    # counted: 100 to 150. Job 3 asks for CPUs, so it is planned on named nodes, after
    # the counted reservations end; job 4 is counted again and starts now.
    cluster = nodes(4, cpus=16)
    busy = [running(1, ["n0"], 100)]
    jobs = [pending(2, 1, 4, 50), pending(3, 2, 1, 10, cpus=4), pending(4, 3, 2, 60)]
    result = decide(cluster, jobs, busy, 0.0)
    assert set(started(result)) == {4}
    times = {job: at for job, (at, _) in reserved(result).items()}
    assert times == {2: 100.0, 3: 150.0}
    assert_no_node_given_twice(cluster, busy, jobs, result, 0.0)


def assert_no_node_given_twice(cluster: list[NodeView], busy: list[RunningJob],
                               jobs: list[PendingJob], result: Plan, now: float) -> None:
    """On 1-GPU nodes, what runs, starts and is reserved never overlaps on one node."""
    limit = {job.job_id: float(job.time_limit or INF) for job in jobs}
    held: dict[str, list[tuple[float, float, str]]] = {n.name: [] for n in cluster}
    for job in busy:
        for name in job.nodes or (job.node,):
            held[name].append((now, job.end_time or INF, f"running {job.job_id}"))
    for start in result.starts:
        for name in start.nodes or (start.node,):
            held[name].append((now, now + limit[start.job_id], f"start {start.job_id}"))
    for r in result.reservations:
        assert r.start_time >= now
        for name in r.nodes:
            held[name].append((r.start_time, r.start_time + limit[r.job_id], f"held {r.job_id}"))
    for name, spans in held.items():
        spans.sort()
        for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
            assert start >= end, f"{name}: {a} and {b} overlap"


@st.composite
def unit_node_passes(draw: st.DrawFn) -> tuple[list[NodeView], list[RunningJob],
                                                list[PendingJob]]:
    """Up to 8 one-GPU nodes (with CPUs), some busy, and a queue of up to 25 jobs of
    1-4 nodes, some asking for CPUs (planned per node) and most not (counted)."""
    count = draw(st.integers(1, 8))
    cluster = nodes(count, cpus=8)
    busy = [running(100 + i, [f"n{i}"], draw(st.integers(1, 60)))
            for i in range(count) if draw(st.booleans())]
    jobs = [pending(i, i, draw(st.integers(1, count)), draw(st.integers(1, 60)),
                    cpus=draw(st.sampled_from((0, 0, 0, 2))))
            for i in range(1, draw(st.integers(1, 25)) + 1)]
    return cluster, busy, jobs


@settings(max_examples=200, deadline=None)
@given(case=unit_node_passes())
def test_every_job_is_reserved_and_no_node_is_given_twice(
        case: tuple[list[NodeView], list[RunningJob], list[PendingJob]]) -> None:
    cluster, busy, jobs = case
    result = decide(cluster, jobs, busy, 0.0)
    assert assert_all_placed(jobs, result)
    assert_no_node_given_twice(cluster, busy, jobs, result, 0.0)
    # Conservative: a job's decision depends only on the jobs ahead of it.
    first = decide(cluster, jobs[: len(jobs) // 2], busy, 0.0)
    assert reserved(first).keys() <= reserved(result).keys()
    assert all(reserved(result)[job][0] == at for job, (at, _) in reserved(first).items())
    assert set(started(first)) <= set(started(result))


def assert_all_placed(jobs: list[PendingJob], result: Plan) -> bool:
    """Every job either starts or has a reservation naming as many nodes as it asks."""
    starts, held = started(result), reserved(result)
    for job in jobs:
        where = starts.get(job.job_id) or held.get(job.job_id, (0.0, ()))[1]
        assert len(where) == job.nodes, (job, where)
    return True


def test_profile_earliest_and_add() -> None:
    # Two units now, one more at 10 and at 20.
    profile = Profile(0.0, 2, [10.0, 20.0, INF])
    assert (profile.times, profile.free) == ([0.0, 10.0, 20.0], [2, 3, 4])
    profile.add(5.0, 15.0, -2)
    assert (profile.times, profile.free) == ([0.0, 5.0, 10.0, 15.0, 20.0], [2, 0, 1, 3, 4])
    assert profile.earliest(2, 5.0, 0.0) == 0.0
    assert profile.earliest(2, 6.0, 0.0) == 15.0
    assert profile.earliest(1, 10.0, 0.0) == 10.0
    assert profile.earliest(4, INF, 0.0) == 20.0
    assert profile.earliest(5, 1.0, 0.0) == INF
    assert profile.earliest(3, 1.0, 16.0) == 16.0
    assert profile.at(12.0) == 1 and profile.next_after(15.0) == 20.0
    profile.add(18.0, INF, -4)
    assert profile.earliest(1, 1.0, 16.0) == 16.0
    assert profile.earliest(1, 3.0, 16.0) == INF
