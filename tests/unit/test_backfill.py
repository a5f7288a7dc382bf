"""Backfill with reservations, best fit and topology, checked by hand and by property."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.capacity import kind_matches
from gpusched.core.model import (
    GpuView,
    NodeState,
    NodeView,
    PartitionView,
    PendingJob,
    Plan,
    Policy,
    Reason,
    RunningJob,
    Snapshot,
    StartKind,
)
from gpusched.core.plan import plan
from gpusched.core.priority import PriorityWeights
from gpusched.core.topology import best_set, link_rank
from gpusched.sim.cluster import uniform
from gpusched.sim.replay import SimPolicy, simulate
from gpusched.sim.traces import TraceJob
from tests.unit.test_plan import node, reasons

FIFO_ORDER = PriorityWeights(age=1000, fairshare=0, job_size=0, partition=0, qos=0)


def pj(job_id: int, gpus: int, limit: int | None, **fields: object) -> PendingJob:
    """A pending job; lower ids were submitted earlier and so come first."""
    return replace(PendingJob(job_id, "gpu", gpus, 1000, -100.0 + job_id, limit), **fields)  # type: ignore[arg-type]


def snapshot(nodes: list[NodeView], jobs: list[PendingJob],
             running: list[RunningJob] = ()) -> Snapshot:  # type: ignore[assignment]
    return Snapshot(tuple(nodes), (PartitionView("gpu", tuple(n.name for n in nodes)),),
                    tuple(jobs), tuple(running))


def policy(mode: str, **fields: object) -> Policy:
    return Policy(weights=FIFO_ORDER, backfill=mode, **fields)  # type: ignore[arg-type]


# One 4-GPU node at t=0: R1 holds 2 GPUs until t=10, R2 one until t=30; one is free.
RUNNING = [RunningJob(91, "n0", ("n0-g0", "n0-g1"), end_time=10.0),
           RunningJob(92, "n0", ("n0-g2",), end_time=30.0)]
QUEUE = [pj(1, 4, 20), pj(2, 3, 10), pj(3, 1, 40), pj(4, 1, 15), pj(5, 1, 5)]


def decide(mode: str) -> Plan:
    return plan(snapshot([node("n0", 4)], QUEUE, RUNNING), 0.0, policy(mode))


def test_fcfs_starts_nothing_behind_the_blocked_head() -> None:
    p = decide("none")
    assert p.starts == () and p.reservations == ()
    assert reasons(p) == {1: Reason.RESOURCES, 2: Reason.PRIORITY, 3: Reason.PRIORITY,
                          4: Reason.PRIORITY, 5: Reason.PRIORITY}


def test_easy_reserves_the_head_and_backfills_what_ends_before_it() -> None:
    p = decide("easy")
    # Job 1 needs all 4 GPUs: R1 and R2 are both gone at t=30.
    assert [(r.job_id, r.start_time, r.nodes) for r in p.reservations] == [(1, 30.0, ("n0",))]
    # Job 3 (1 GPU for 40 s) fits now but would still hold its GPU at t=30: not started.
    # Job 4 (15 s) ends before t=30: backfilled. Job 5 then finds no free GPU.
    assert [(s.job_id, s.kind, s.gpu_uuids) for s in p.starts] == [
        (4, StartKind.BACKFILLED, ("n0-g3",))]
    assert reasons(p) == {1: Reason.RESOURCES, 2: Reason.PRIORITY, 3: Reason.PRIORITY,
                          5: Reason.PRIORITY}
    # Every waiting job has an expected start: job 1 its reservation, the others the
    # earliest their resources are free around it (job 2: 3 GPUs at t=10 for 10 s; job 3
    # must run 40 s, so after job 1; job 5: at t=10, when R1 ends).
    assert {d.job_id: d.expected_start for d in p.pending} == {1: 30.0, 2: 10.0, 3: 50.0,
                                                               5: 10.0}
    assert all(d.expected_start is None for d in decide("none").pending)


def test_conservative_reserves_every_job_and_backfills_only_what_delays_none() -> None:
    p = decide("conservative")
    # Job 2 (3 GPUs, 10 s) fits in [10, 20), before job 1's [30, 50). Jobs 3 and 4 each
    # fit now, but would hold the GPU job 2 needs at t=10: both reserved at t=50.
    assert [(r.job_id, r.start_time) for r in p.reservations] == [
        (1, 30.0), (2, 10.0), (3, 50.0), (4, 50.0)]
    assert [(s.job_id, s.kind) for s in p.starts] == [(5, StartKind.BACKFILLED)]


def test_the_reservation_depth_is_configurable() -> None:
    p = plan(snapshot([node("n0", 4)], QUEUE, RUNNING), 0.0, policy("easy", reservations=2))
    assert [(r.job_id, r.start_time) for r in p.reservations] == [(1, 30.0), (2, 10.0)]
    assert [s.job_id for s in p.starts] == [5]  # 4 would now delay job 2


def test_an_unlimited_job_never_backfills_before_a_reservation() -> None:
    p = plan(snapshot([node("n0", 4)], [pj(1, 4, 20), pj(2, 1, None)], RUNNING), 0.0,
             policy("easy"))
    assert p.starts == () and reasons(p)[2] is Reason.PRIORITY


def test_best_fit_keeps_whole_nodes_free() -> None:
    nodes = [node("a", 8), node("b", 8), node("c", 4)]
    running = [RunningJob(90, "b", tuple(f"b-g{i}" for i in range(5)))]
    p = plan(snapshot(nodes, [pj(1, 3, 60), pj(2, 4, 60), pj(3, 8, 60)], running), 0.0,
             policy("easy"))
    assert {s.job_id: s.node for s in p.starts} == {1: "b", 2: "c", 3: "a"}


def test_multi_node_jobs_are_all_or_nothing_and_prefer_one_block() -> None:
    nodes = [replace(node(f"n{i}", 4), block="x" if i < 2 else "y") for i in range(5)]
    busy = [RunningJob(90, "n0", ("n0-g0",))]
    p = plan(snapshot(nodes, [pj(1, 4, 60, nodes=2)], busy), 0.0, policy("easy"))
    (start,) = p.starts
    assert start.nodes in (("n2", "n3"), ("n3", "n4"), ("n2", "n4"))  # block y: both free
    assert len(start.gpu_uuids) == 8 and start.node == start.nodes[0]
    too_big = plan(snapshot(nodes, [pj(1, 4, 60, nodes=5)], busy), 0.0, policy("easy"))
    assert too_big.starts == () and reasons(too_big) == {1: Reason.RESOURCES}


def test_typed_requests_and_mig_slices() -> None:
    mixed = NodeView("m", NodeState.UP, (
        GpuView("A0", 0, gpu_type="a100-80gb"),
        GpuView("H0", 1, gpu_type="h100-80gb", mig_mode=True),
        *(GpuView(f"M{i}", 10 + i, gpu_type="h100-80gb", mig_profile="1g.10gb", parent=1)
          for i in range(7)),
        GpuView("L0", 2, gpu_type="l4"),
    ))
    jobs = [pj(1, 1, 60, gpu_kinds=("h100",)), pj(2, 1, 60, gpu_kinds=("a100", "h100")),
            pj(3, 2, 60, gpu_kinds=("1g.10gb",)), pj(4, 1, 60), pj(5, 1, 60)]
    p = plan(snapshot([mixed], jobs), 0.0, policy("easy"))
    got = {s.job_id: s.gpu_uuids for s in p.starts}
    assert 1 not in got  # the only H100 is in MIG mode: never handed out whole
    assert got[2] == ("A0",) and got[3] == ("M0", "M1") and got[4] == ("L0",)
    assert 5 not in got and reasons(p)[5] is Reason.PRIORITY


@pytest.mark.parametrize(("kind", "is_slice", "wanted", "ok"), [
    ("a100-80gb", False, (), True), ("1g.10gb", True, (), False),
    ("a100-80gb", False, ("a100",), True), ("a100-80gb", False, ("a10",), False),
    ("a100-80gb", False, ("a100-80gb",), True), ("1g.10gb", True, ("1g.10gb",), True),
    ("2g.20gb", True, ("1g.10gb",), False), ("l4", False, ("a100", "l4"), True),
])
def test_kind_matches(kind: str, is_slice: bool, wanted: tuple[str, ...], ok: bool) -> None:
    assert kind_matches(kind, is_slice, wanted) is ok


def two_islands() -> dict[tuple[int, int], int]:
    """8 GPUs: 0-3 and 4-7 all NVLinked within; across, a PCIe host bridge or sockets."""
    links = {}
    for a in range(8):
        for b in range(a + 1, 8):
            same = (a < 4) == (b < 4)
            links[(a, b)] = link_rank("NVLINK", 4) if same else link_rank(
                "PCIE_HOST_BRIDGE" if (a % 4) == (b % 4) else "SYSTEM")
    return links


def test_nvlink_islands_on_an_eight_gpu_node() -> None:
    links = two_islands()
    assert best_set(range(8), 4, links) in ((0, 1, 2, 3), (4, 5, 6, 7))
    # 0 and 5 taken: a 3-GPU job gets a whole island's rest, not a mix.
    assert best_set((1, 2, 3, 4, 6, 7), 3, links) in ((1, 2, 3), (4, 6, 7))
    # Two GPUs: an NVLinked pair, from the island left more broken.
    assert best_set((0, 1, 2, 4, 5, 6, 7), 2, links) in ((0, 1), (0, 2), (1, 2))
    # One GPU: take it where it breaks nothing that is whole.
    assert best_set((0, 4, 5, 6, 7), 1, links) == (0,)
    view = NodeView("n", NodeState.UP, tuple(GpuView(f"g{i}", i) for i in range(8)),
                    links=links)
    p = plan(snapshot([view], [pj(1, 2, 60), pj(2, 4, 60), pj(3, 2, 60)]), 0.0, policy("easy"))
    islands = [{int(u[1:]) < 4 for u in s.gpu_uuids} for s in p.starts]
    assert all(len(side) == 1 for side in islands)  # no job straddles the islands


# -- properties -----------------------------------------------------------------------

@st.composite
def clusters(draw: st.DrawFn) -> tuple[Snapshot, Policy]:
    nodes, running, uid = [], [], 1000
    for n in range(draw(st.integers(1, 4))):
        size = draw(st.integers(1, 8))
        unhealthy = tuple(draw(st.sets(st.integers(0, size - 1), max_size=1)))
        state = draw(st.sampled_from([NodeState.UP] * 4 + [NodeState.DRAIN]))
        view = replace(node(f"n{n}", size, state, unhealthy=unhealthy), cpus=16, memory_mb=64)
        nodes.append(view)
        taken = 0
        for r in range(draw(st.integers(0, 3))):
            count = draw(st.integers(0, size - taken))
            running.append(RunningJob(900 + 10 * n + r, view.name,
                                      tuple(f"n{n}-g{taken + i}" for i in range(count)),
                                      end_time=draw(st.sampled_from([None, 5.0, 20.0, 60.0])),
                                      cpus=draw(st.integers(0, 4))))
            taken += count
    jobs = [PendingJob(j, "gpu", draw(st.integers(0, 8)), uid, float(j),
                       draw(st.sampled_from([None, 5, 10, 30, 100])),
                       nodes=draw(st.sampled_from([1, 1, 1, 2])),
                       cpus=draw(st.integers(0, 8)), mem_mb=draw(st.integers(0, 40)))
            for j in range(1, draw(st.integers(1, 12)))]
    snap = Snapshot(tuple(nodes), (PartitionView("gpu", tuple(v.name for v in nodes)),),
                    tuple(jobs), tuple(running))
    mode = draw(st.sampled_from(["none", "easy", "conservative"]))
    return snap, policy(mode)


def _usage_over_time(snap: Snapshot, p: Plan, now: float = 0.0) -> None:
    """No GPU, CPU or memory is ever promised twice, now or at any later time."""
    jobs = {j.job_id: j for j in snap.pending}
    nodes = {n.name: n for n in snap.nodes}
    intervals: list[tuple[str, float, float, int, int, int]] = []  # node, start, end, g, c, m
    for r in snap.running:
        per_node = Counter(u.rsplit("-g", 1)[0] for u in r.gpu_uuids)
        for name in r.nodes or (r.node,):
            intervals.append((name, now, r.end_time or float("inf"), per_node[name], r.cpus, 0))
    for s in p.starts:
        job = jobs[s.job_id]
        end = now + (job.time_limit or float("inf"))
        for name in s.nodes or (s.node,):
            intervals.append((name, now, end, job.gpus, job.cpus, job.mem_mb))
    for res in p.reservations:
        job = jobs[res.job_id]
        for name in res.nodes:
            intervals.append((name, res.start_time,
                              res.start_time + (job.time_limit or float("inf")),
                              job.gpus, job.cpus, job.mem_mb))
    points = {start for _, start, _, _, _, _ in intervals}
    for name, view in nodes.items():
        healthy = len(view.gpus)  # running jobs may hold a GPU that has since failed
        for t in points:
            active = [i for i in intervals if i[0] == name and i[1] <= t < i[2]]
            assert sum(i[3] for i in active) <= healthy, (name, t, active)
            assert sum(i[4] for i in active) <= view.cpus, (name, t, active)
            assert sum(i[5] for i in active) <= view.memory_mb, (name, t, active)


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_no_resource_is_ever_promised_twice(case: tuple[Snapshot, Policy]) -> None:
    snap, pol = case
    p = plan(snap, 0.0, pol)
    uuids = [u for s in p.starts for u in s.gpu_uuids]
    assert len(uuids) == len(set(uuids))
    held = {u for r in snap.running for u in r.gpu_uuids}
    usable = {g.uuid for n in snap.nodes if n.state is NodeState.UP for g in n.gpus if g.healthy}
    assert set(uuids) <= usable - held  # nothing drained, unhealthy or already held
    _usage_over_time(snap, p)
    assert p == plan(snap, 0.0, pol)  # identical input, identical plan
    expected = {d.job_id: d.expected_start for d in p.pending}
    for r in p.reservations:  # a reserved job is expected at its reservation
        assert expected[r.job_id] == r.start_time
    assert all(at is None or at >= 0.0 for at in expected.values())


@settings(max_examples=200, deadline=None)
@given(clusters())
def test_removing_backfilled_jobs_never_moves_a_reservation_earlier(
        case: tuple[Snapshot, Policy]) -> None:
    snap, pol = case
    p = plan(snap, 0.0, pol)
    backfilled = {s.job_id for s in p.starts if s.kind is StartKind.BACKFILLED}
    without = plan(replace(snap, pending=tuple(j for j in snap.pending
                                               if j.job_id not in backfilled)), 0.0, pol)
    before = {r.job_id: r.start_time for r in p.reservations}
    after = {r.job_id: r.start_time for r in without.reservations}
    for job_id, at in before.items():
        # Jobs come in id order here: a backfilled job ranks below every job it passed,
        # so the reservations of those jobs are the same with or without it.
        if all(b > job_id for b in backfilled):
            assert after.get(job_id) == at, (job_id, at, after.get(job_id))
    assert not backfilled or pol.backfill != "none"


def test_explain_says_why_a_job_was_not_backfilled() -> None:
    from gpusched.core.explain import explain

    why = explain(snapshot([node("n0", 4)], QUEUE, RUNNING), 0.0, policy("easy"), 3)
    assert why.reason is Reason.PRIORITY
    assert [b.detail for b in why.blockers] == [
        "not backfilled: it has room on n0 now, but would still run when job 1's reservation "
        "starts there in 0:30: it would start now with a time limit <= 0:30"]


def test_a_pass_budget_resumes_where_it_stopped_and_reaches_every_job() -> None:
    """Node n0 is full for a long time and job 1 waits for it; jobs 2-9 could only
    backfill. With a budget of 3 jobs per pass, each pass goes on after the last job the
    previous one examined, wrapping round, instead of starting over at the top."""
    full = [RunningJob(90, "n0", tuple(f"n0-g{i}" for i in range(4)), end_time=1000.0)]
    # A stored reason no pass gives these jobs marks the ones a pass did not examine.
    jobs = [pj(1, 4, 100)] + [pj(j, 1, 2000, reason=Reason.BEGIN_TIME) for j in range(2, 10)]
    snap = snapshot([node("n0", 4)], jobs, full)
    pol = policy("easy", backfill_max_jobs=3)
    seen, resume = [], None
    for _ in range(4):
        p = plan(snap, 0.0, pol, resume)
        seen.append(sorted(j for j, r in reasons(p).items() if r is Reason.PRIORITY))
        assert reasons(p)[1] is Reason.RESOURCES  # the head is examined every pass
        resume = p.resume_after
    assert seen == [[2, 3, 4], [5, 6, 7], [2, 8, 9], [3, 4, 5]]
    whole = plan(snap, 0.0, policy("easy"))
    assert whole.resume_after is None and reasons(whole) == {1: Reason.RESOURCES, **{
        j: Reason.PRIORITY for j in range(2, 10)}}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2), st.booleans()), min_size=1,
                max_size=3),
       st.lists(st.tuples(st.sampled_from([(), ("a100",), ("h100",), ("1g.10gb",),
                                           ("a100", "1g.10gb")]),
                          st.integers(1, 4), st.sampled_from([None, 60])), max_size=10))
def test_units_given_match_the_request_and_mig_gpus_are_never_whole(
        layout: list[tuple[int, int, bool]], requests: list[tuple[tuple[str, ...], int, int | None]]
) -> None:
    nodes = []
    for n, (a100s, migs, h100) in enumerate(layout):
        gpus = [GpuView(f"n{n}-a{i}", i, gpu_type="a100-80gb") for i in range(a100s)]
        if h100:
            gpus.append(GpuView(f"n{n}-h", 50, gpu_type="h100-80gb"))
        for m in range(migs):
            gpus.append(GpuView(f"n{n}-m{m}", 60 + m, gpu_type="a100-80gb", mig_mode=True))
            gpus += [GpuView(f"n{n}-m{m}-s{k}", 100 + 10 * m + k, gpu_type="a100-80gb",
                             mig_profile="1g.10gb", parent=60 + m) for k in range(3)]
        nodes.append(NodeView(f"n{n}", NodeState.UP, tuple(gpus)))
    jobs = [PendingJob(j + 1, "gpu", count, 1000, float(j), limit, gpu_kinds=kinds)
            for j, (kinds, count, limit) in enumerate(requests)]
    snap = Snapshot(tuple(nodes), (PartitionView("gpu", tuple(v.name for v in nodes)),), tuple(jobs))
    p = plan(snap, 0.0, policy("conservative"))
    units = {g.uuid: g for v in nodes for g in v.gpus}
    wanted = {j.job_id: j for j in jobs}
    used = [u for s in p.starts for u in s.gpu_uuids]
    assert len(used) == len(set(used))
    for s in p.starts:
        job = wanted[s.job_id]
        assert len(s.gpu_uuids) == job.gpus
        assert len({units[u].kind for u in s.gpu_uuids}) == 1  # one kind per node
        for u in s.gpu_uuids:
            gpu = units[u]
            assert not gpu.mig_mode
            assert kind_matches(gpu.kind, gpu.mig_profile is not None, job.gpu_kinds)


def test_mig_slices_are_packed_onto_the_gpu_with_the_fewest_free() -> None:
    def slices(parent: int, free: int) -> list[GpuView]:
        return [GpuView(f"p{parent}-s{k}", 10 * parent + k, gpu_type="a100-80gb",
                        mig_profile="1g.10gb", parent=parent) for k in range(free)]
    view = NodeView("m", NodeState.UP, (
        GpuView("P1", 1, gpu_type="a100-80gb", mig_mode=True),
        GpuView("P2", 2, gpu_type="a100-80gb", mig_mode=True),
        *slices(1, 3), *slices(2, 1)))
    p = plan(snapshot([view], [pj(1, 1, 60, gpu_kinds=("1g.10gb",)),
                               pj(2, 2, 60, gpu_kinds=("1g.10gb",))]), 0.0, policy("easy"))
    got = {s.job_id: s.gpu_uuids for s in p.starts}
    assert got[1] == ("p2-s0",)  # GPU 2's last free slice, leaving GPU 1's three together
    assert got[2] == ("p1-s0", "p1-s1")


@pytest.mark.parametrize(("mode", "answers", "reserved"), [
    ("easy", [0.4, 0.6, 1.0], 64),  # EASY: reservations for half of the budget
    ("conservative", [0.4, 0.6, 1.0], 96),  # conservative: for 0.8 of it
    ("conservative", [0.6, 0.85, 1.0], 64),
    ("conservative", [0.79, 0.8, 1.0], 64),
])
def test_a_pass_stops_when_its_time_budget_is_spent(mode: str, answers: list[float],
                                                    reserved: int) -> None:
    """The caller says what part of the budget is used (asked every 32 jobs): from a
    share of it on (half under EASY, 0.8 under conservative backfill) no more
    reservations are made, at all of it the pass stops; the jobs not reached keep their
    stored reasons, and the plan says where it stopped."""
    busy = [RunningJob(90, "n0", ("n0-g0",), end_time=1000.0)]
    jobs = [pj(j, 1, 100, reason=Reason.BEGIN_TIME) for j in range(1, 201)]
    told = iter(answers)
    asked: list[int] = []

    def spent() -> float:
        asked.append(1)
        return next(told)

    deep = policy(mode, reservations=1000)
    p = plan(snapshot([node("n0", 1)], jobs, busy), 0.0, deep, spent=spent)
    examined = sorted(j for j, r in reasons(p).items() if r is not Reason.BEGIN_TIME)
    assert examined == list(range(1, 97)) and len(asked) == 3
    assert p.resume_after == 96 and len(p.pending) == 200
    assert [r.job_id for r in p.reservations] == list(range(1, reserved + 1))
    whole = plan(snapshot([node("n0", 1)], jobs, busy), 0.0, deep)
    assert whole.resume_after is None and len(whole.reservations) == 200


# -- EASY's extra nodes ---------------------------------------------------------------
# A reservation takes, of the nodes ready by its start, those ready last and the idle
# ones last of all, so what is left over at its start is idle now and free for a job
# that runs past it. A job that ends before the reservation takes a reserved node
# first, which leaves that idle capacity to the jobs that need it.

def one_gpu_nodes(count: int, blocks: dict[str, str] | None = None) -> list[NodeView]:
    return [replace(node(f"n{i}", 1), block=(blocks or {}).get(f"n{i}"))
            for i in range(count)]


def running_on(job_id: int, names: tuple[str, ...], end: float, gpus: int = 1
               ) -> RunningJob:
    """A job holding the first ``gpus`` GPUs of each of ``names`` until ``end``."""
    return RunningJob(job_id, names[0], tuple(f"{n}-g{i}" for n in names for i in range(gpus)),
                      end_time=end, nodes=names if len(names) > 1 else (), start_time=0.0)


def test_easy_starts_a_long_job_on_the_extra_node() -> None:
    # 4 nodes: A holds n0 and n1 until t=100. B needs 3 nodes: at t=100 four are free,
    # one more than B needs, so C (1 node for 1000 s) may start now beside it.
    a = running_on(90, ("n0", "n1"), 100.0)
    queue = [pj(1, 1, 100, nodes=3), pj(2, 1, 1000)]
    p = plan(snapshot(one_gpu_nodes(4), queue, [a]), 2.0, policy("easy"))
    assert [(r.job_id, r.start_time, r.nodes) for r in p.reservations] == [
        (1, 100.0, ("n0", "n1", "n2"))]
    assert [(s.job_id, s.node, s.kind) for s in p.starts] == [(2, "n3", StartKind.BACKFILLED)]
    # With both idle nodes needed there is no extra node: C waits.
    p = plan(snapshot(one_gpu_nodes(4), [pj(1, 1, 100, nodes=4), pj(2, 1, 1000)], [a]), 2.0,
             policy("easy"))
    assert p.starts == () and reasons(p) == {1: Reason.RESOURCES, 2: Reason.PRIORITY}


def test_easy_starts_a_multi_node_job_on_the_extra_nodes() -> None:
    # 7 nodes, A on three until t=100; B needs 5, so 2 of the 4 idle nodes are extra.
    a = running_on(90, ("n0", "n1", "n2"), 100.0)
    queue = [pj(1, 1, 100, nodes=5), pj(2, 1, 1000, nodes=2), pj(3, 1, 1000)]
    p = plan(snapshot(one_gpu_nodes(7), queue, [a]), 2.0, policy("easy"))
    assert [(r.job_id, r.nodes) for r in p.reservations] == [
        (1, ("n0", "n1", "n2", "n3", "n4"))]
    assert [(s.job_id, s.nodes) for s in p.starts] == [(2, ("n5", "n6"))]
    assert reasons(p)[3] is Reason.PRIORITY  # no extra node left for a third


def test_the_extra_gpus_of_one_node_go_to_a_long_job_and_no_more() -> None:
    # One 4-GPU node, A holds 2 GPUs until t=100 and B needs 3 GPUs: at t=100 one GPU is
    # extra. C (long) takes it; D (long) would take one of B's and waits; E ends before
    # t=100 and takes the last free GPU.
    a = RunningJob(90, "n0", ("n0-g0", "n0-g1"), end_time=100.0, start_time=0.0)
    queue = [pj(1, 3, 100), pj(2, 1, 1000), pj(3, 1, 1000), pj(4, 1, 50)]
    p = plan(snapshot([node("n0", 4)], queue, [a]), 2.0, policy("easy"))
    assert [(r.job_id, r.start_time) for r in p.reservations] == [(1, 100.0)]
    assert [s.job_id for s in p.starts] == [2, 4]
    assert reasons(p)[3] is Reason.PRIORITY
    assert {u for s in p.starts for u in s.gpu_uuids} == {"n0-g2", "n0-g3"}


def test_a_reservation_on_multi_gpu_nodes_takes_the_gpus_freed_by_its_start() -> None:
    # Three 2-GPU nodes: n0 idle, n1 one GPU busy until t=100, n2 both until t=100. B
    # needs 2 nodes x 2 GPUs at t=100: it holds n1 and n2, not the idle n0, which C (long,
    # 2 GPUs) then gets now. D (long, 1 GPU) would hold n1's free GPU past t=100 and
    # waits; E (1 GPU, ends by t=100) takes it.
    running = [RunningJob(90, "n1", ("n1-g0",), end_time=100.0, start_time=0.0),
               RunningJob(91, "n2", ("n2-g0", "n2-g1"), end_time=100.0, start_time=0.0)]
    queue = [pj(1, 2, 100, nodes=2), pj(2, 2, 1000), pj(3, 1, 1000), pj(4, 1, 50)]
    nodes = [node(f"n{i}", 2) for i in range(3)]
    p = plan(snapshot(nodes, queue, running), 2.0, policy("easy"))
    assert [(r.job_id, r.start_time, sorted(r.nodes)) for r in p.reservations] == [
        (1, 100.0, ["n1", "n2"])]
    assert [(s.job_id, s.node) for s in p.starts] == [(2, "n0"), (4, "n1")]
    assert reasons(p)[3] is Reason.PRIORITY


def test_a_replay_starts_the_long_job_on_the_extra_node_at_once() -> None:
    # The same case through the simulator: A (2 nodes, 100 s) at t=0, B (3 nodes) at
    # t=1, C (1 node, 1000 s) at t=2, on 4 one-GPU nodes.
    jobs = [TraceJob(1, 0.0, 100.0, 100, 2), TraceJob(2, 1.0, 100.0, 100, 3),
            TraceJob(3, 2.0, 1000.0, 1000, 1)]
    result = simulate(jobs, uniform(4, 1), SimPolicy(backfill="easy", kill=False))
    starts = {r.job_id: (r.start, r.backfilled) for r in result.records}
    assert starts == {1: (0.0, False), 2: (100.0, False), 3: (2.0, True)}
    fcfs = simulate(jobs, uniform(4, 1), SimPolicy(backfill="none", kill=False))
    assert {r.job_id: r.start for r in fcfs.records}[3] == 100.0


@pytest.mark.parametrize("short_nodes", [1, 2])
def test_a_job_ending_before_the_reservation_takes_a_reserved_node(short_nodes: int) -> None:
    # Blocks keep B (5 nodes) on n2-n6 (block y), so n0 and n1 (block x) are the extra
    # nodes. A short job goes on B's idle nodes n5/n6 though n0 and n1 come first by
    # name, leaving both extra nodes to the long jobs behind it.
    blocks = {f"n{i}": "x" if i < 2 else "y" for i in range(7)}
    a = running_on(90, ("n2", "n3", "n4"), 100.0)
    long = [pj(3, 1, 1000, nodes=2)] if short_nodes == 2 else [pj(3, 1, 1000), pj(4, 1, 1000)]
    queue = [pj(1, 1, 100, nodes=5), pj(2, 1, 50, nodes=short_nodes), *long]
    p = plan(snapshot(one_gpu_nodes(7, blocks), queue, [a]), 2.0, policy("easy"))
    assert [(r.job_id, sorted(r.nodes)) for r in p.reservations] == [
        (1, ["n2", "n3", "n4", "n5", "n6"])]
    started = {s.job_id: set(s.nodes or (s.node,)) for s in p.starts}
    assert started[2] <= {"n5", "n6"} and len(started[2]) == short_nodes
    assert set().union(*(started[j.job_id] for j in long)) == {"n0", "n1"}
