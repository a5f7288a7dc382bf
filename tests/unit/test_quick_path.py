"""The pass decides most jobs of a long queue on a short path (``SchedulingPass.consider``
with ``_behind``): a job only backfill could start that needs at least what could not
start waits behind the blocked job, with the estimate jobs of its size share. A
differential property test: on random clusters (whole GPUs, MIG slices, GPUs with their
memory known) and queues, the pass makes exactly the decisions, reservations and
estimates that it makes when every job takes the full path (``_try_start``)."""

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
from gpusched.core.ordering import queue_order
from gpusched.core.plan import SchedulingPass

NOW = 10_000.0


def _node(index: int, gpus: int, mig: bool) -> NodeView:
    units = [GpuView(f"n{index}-g{g}", g, gpu_type="a100-40gb", memory_mb=40_960)
             for g in range(gpus)]
    if mig:  # the last GPU cut into 1g.5gb slices
        parent = gpus - 1
        units[parent] = GpuView(f"n{index}-g{parent}", parent, gpu_type="a100-40gb",
                                mig_mode=True, memory_mb=40_960)
        units += [GpuView(f"n{index}-m{s}", 10 + s, gpu_type="a100-40gb",
                          mig_profile="1g.5gb", parent=parent, memory_mb=4_864)
                  for s in range(3)]
    return NodeView(f"n{index}", NodeState.UP, tuple(units), cpus=32, memory_mb=256_000)


job_st = st.tuples(
    st.integers(1, 4),                      # GPUs per node
    st.sampled_from((1, 1, 1, 2)),          # nodes
    st.sampled_from((600, 3600, 7200, None)),
    st.sampled_from((0, 0, 0, 4_000, 30_000)),  # GPU memory alone (--gpu-mem)
    st.booleans(),                          # exclusive
    st.sampled_from(((), (), ("a100",), ("1g.5gb",))),
    st.integers(0, 3),                      # user
)


def _snapshot(sizes: list[tuple[int, bool]], running: list[tuple[int, int, int]],
              queue: list[tuple[int, int, int | None, int, bool, tuple[str, ...], int]]
              ) -> Snapshot:
    nodes = tuple(_node(i, gpus, mig) for i, (gpus, mig) in enumerate(sizes))
    jobs = []
    for j, (node, count, ends) in enumerate(running):
        view = nodes[node % len(nodes)]
        whole = [g.uuid for g in view.gpus if g.mig_profile is None and not g.mig_mode]
        if whole:
            jobs.append(RunningJob(900 + j, view.name, tuple(whole[:count]),
                                   end_time=NOW + ends, user="u0"))
    taken: set[str] = set()
    held = []
    for job in jobs:  # no GPU held twice
        if not taken.intersection(job.gpu_uuids):
            taken.update(job.gpu_uuids)
            held.append(job)
    pending = tuple(
        PendingJob(i + 1, "gpu", 1 if mem else gpus, 1000 + user, NOW - 1000 + i,
                   time_limit=limit, user=f"u{user}", nodes=count,
                   gpu_kinds=kinds if not mem else (), gpu_mem_mb=mem,
                   exclusive=exclusive and not mem, cpus=2, mem_mb=1024)
        for i, (gpus, count, limit, mem, exclusive, kinds, user) in enumerate(queue))
    return Snapshot(nodes, (PartitionView("gpu", tuple(n.name for n in nodes)),),
                    pending, tuple(held))


def _decide(snap: Snapshot, policy: Policy, quick: bool) -> Plan:
    sched = SchedulingPass(snap, NOW, policy)
    sched.quick = sched.quick and quick
    return sched.run(queue_order(snap, NOW, policy))


@given(st.lists(st.tuples(st.sampled_from((2, 4, 8)), st.booleans()), min_size=1, max_size=5),
       st.lists(st.tuples(st.integers(0, 9), st.integers(1, 8), st.integers(60, 20_000)),
                max_size=8),
       st.lists(job_st, max_size=40),
       st.sampled_from((0, 1, 3)), st.booleans())
@settings(max_examples=300, deadline=None)
def test_the_short_path_decides_as_the_full_one(
        sizes: list[tuple[int, bool]], running: list[tuple[int, int, int]],
        queue: list[tuple[int, int, int | None, int, bool, tuple[str, ...], int]],
        reservations: int, estimates: bool) -> None:
    snap = _snapshot(sizes, running, queue)
    policy = Policy(backfill="easy", reservations=reservations, estimates=estimates)
    assert _decide(snap, policy, quick=True) == _decide(snap, policy, quick=False)


def test_a_job_asking_for_gpu_memory_takes_a_free_slice_behind_a_blocked_job() -> None:
    # Every whole GPU is busy, so the 1-GPU job waits (and gets the reservation); the
    # next job asks only for 4 GB of GPU memory, which a free MIG slice has: it starts,
    # though a whole GPU of its size could not.
    snap = _snapshot([(2, True)], [(0, 1, 5_000)],
                     [(1, 1, 3600, 0, False, (), 0), (1, 1, 3600, 4_000, False, (), 1)])
    result = _decide(snap, Policy(backfill="easy", estimates=False), quick=True)
    assert [(s.job_id, s.gpu_uuids) for s in result.starts] == [(2, ("n0-m0",))]
    assert [p.job_id for p in result.pending] == [1]


def test_jobs_of_one_size_get_a_new_estimate_once_a_start_changed_it() -> None:
    # n0's four GPUs are busy until +5000, two of n1's until +100. J1 (4 GPUs on each
    # of two nodes) holds the reservation at +5000. J2 and J3 (3 GPUs for 600 s) could
    # run on n1 from +100; then C (2 GPUs for an hour) backfills on n1 now, and J4, of
    # J2's size, can only start once C ends, at +3600.
    nodes = tuple(NodeView(f"n{i}", NodeState.UP, tuple(GpuView(f"n{i}-g{g}", g)
                                                         for g in range(4))) for i in range(2))
    running = (RunningJob(90, "n0", tuple(f"n0-g{g}" for g in range(4)), end_time=NOW + 5000),
               RunningJob(91, "n1", ("n1-g0", "n1-g1"), end_time=NOW + 100))
    shapes = [(4, 2, 7200), (3, 1, 600), (3, 1, 600), (2, 1, 3600), (3, 1, 600)]
    pending = tuple(PendingJob(i + 1, "gpu", gpus, 1000, NOW - 100 + i, time_limit=limit,
                               nodes=count, priority=100.0 - i)
                    for i, (gpus, count, limit) in enumerate(shapes))
    snap = Snapshot(nodes, (PartitionView("gpu", ("n0", "n1")),), pending, running)
    result = _decide(snap, Policy(backfill="easy", reservations=1), quick=True)
    assert [s.job_id for s in result.starts] == [4]
    waits = {p.job_id: p.expected_start for p in result.pending}
    assert waits[2] == waits[3] == NOW + 100
    assert 4 not in waits and waits[5] == NOW + 3600


partition_st = st.builds(
    PartitionView, st.just("gpu"), st.just(("n0",)), up=st.booleans(),
    max_time=st.sampled_from((None, 600, 3600)),
    allow_accounts=st.sampled_from((None, frozenset({"a"}), frozenset({"a", "b"}))),
    deny_accounts=st.sampled_from((frozenset(), frozenset({"b"}))),
    max_gpus_per_job=st.sampled_from((None, 1, 4)))
waiting_st = st.builds(
    PendingJob, st.just(1), st.sampled_from(("gpu", "gone")), st.integers(1, 8), st.just(1000),
    st.just(NOW), time_limit=st.sampled_from((None, 60, 600, 3600, 7200)),
    account=st.sampled_from((None, "a", "b", "c")))


@given(partition_st, waiting_st)
@settings(max_examples=400, deadline=None)
def test_a_job_the_quick_check_passes_waits_for_no_rule(part: PartitionView,
                                                        job: PendingJob) -> None:
    # The short path and the full one both trust ``_plain``: it may only say a job is
    # clear of every waiting rule (its partition's limits here) when ``waits`` agrees.
    sched = SchedulingPass(Snapshot((_node(0, 8, False),), (part,), (job,), ()), NOW, Policy())
    assert sched._plain(job) == (next(sched.waits(job), None) is None)
