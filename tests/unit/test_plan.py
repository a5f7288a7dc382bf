"""The pure scheduling pass: FIFO per partition, first fit, reasons, invariants."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.fairshare import Account, UserShare
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


def node(name: str, gpus: int, state: NodeState = NodeState.UP, run_uid: int | None = None,
         unhealthy: tuple[int, ...] = ()) -> NodeView:
    return NodeView(name, state, tuple(GpuView(f"{name}-g{i}", i, i not in unhealthy)
                                       for i in range(gpus)), run_uid)


def job(job_id: int, gpus: int, partition: str = "gpu", uid: int = 1000,
        submit: float | None = None) -> PendingJob:
    return PendingJob(job_id, partition, gpus, uid, float(job_id if submit is None else submit))


FIFO = Policy(backfill="none")
IN_ORDER = Policy(weights=PriorityWeights(age=0, fairshare=0, job_size=0, partition=0, qos=0))


def run(nodes: list[NodeView], jobs: list[PendingJob], running: list[RunningJob] = (),  # type: ignore[assignment]
        partitions: list[PartitionView] | None = None, policy: Policy = FIFO) -> Plan:
    parts = partitions or [PartitionView("gpu", tuple(n.name for n in nodes))]
    return plan(Snapshot(tuple(nodes), tuple(parts), tuple(jobs), tuple(running)), 0.0, policy)


def starts(p: Plan) -> dict[int, tuple[str, tuple[str, ...]]]:
    return {s.job_id: (s.node, s.gpu_uuids) for s in p.starts}


def reasons(p: Plan) -> dict[int, Reason]:
    return {d.job_id: d.reason for d in p.pending}


def test_two_jobs_fill_a_node_and_the_third_waits_for_resources() -> None:
    p = run([node("a", 4)], [job(1, 2), job(2, 2), job(3, 2)])
    assert starts(p) == {1: ("a", ("a-g0", "a-g1")), 2: ("a", ("a-g2", "a-g3"))}
    assert reasons(p) == {3: Reason.RESOURCES}


def test_jobs_behind_a_blocked_job_wait_with_reason_priority() -> None:
    p = run([node("a", 4)], [job(1, 3), job(2, 2), job(3, 1)])
    assert set(starts(p)) == {1}
    assert reasons(p) == {2: Reason.RESOURCES, 3: Reason.PRIORITY}
    # With backfill, job 1 has no time limit: job 2 can never get a reservation, and
    # job 3 delays nothing by starting.
    easy = run([node("a", 4)], [job(1, 3), job(2, 2), job(3, 1)], policy=Policy())
    assert [(s.job_id, s.kind) for s in easy.starts] == [(1, StartKind.IMMEDIATE),
                                                         (3, StartKind.BACKFILLED)]
    assert easy.reservations == () and reasons(easy) == {2: Reason.RESOURCES}


def test_submit_order_not_id_order() -> None:
    p = run([node("a", 2)], [job(1, 2, submit=10), job(2, 2, submit=5)])
    assert set(starts(p)) == {2}


def test_first_node_with_room_in_partition_order() -> None:
    p = run([node("a", 1), node("b", 4)], [job(1, 2), job(2, 1)])
    assert starts(p) == {1: ("b", ("b-g0", "b-g1")), 2: ("a", ("a-g0",))}


def test_allocated_unhealthy_and_down_gpus_are_not_offered() -> None:
    nodes = [node("a", 4, unhealthy=(0,)), node("b", 4, state=NodeState.DOWN)]
    p = run(nodes, [job(1, 2), job(2, 1)], running=[RunningJob(9, "a", ("a-g1",))])
    assert starts(p) == {1: ("a", ("a-g2", "a-g3"))}
    assert reasons(p) == {2: Reason.RESOURCES}


def test_node_of_an_unprivileged_agent_runs_only_its_users_jobs() -> None:
    p = run([node("a", 2, run_uid=1000)], [job(1, 1, uid=2000), job(2, 1, uid=1000)],
            partitions=[PartitionView("gpu", ("a",)), PartitionView("other", ("a",))])
    assert reasons(p) == {1: Reason.RESOURCES, 2: Reason.PRIORITY}
    easy = run([node("a", 2, run_uid=1000)], [job(1, 1, uid=2000), job(2, 1, uid=1000)],
               partitions=[PartitionView("gpu", ("a",)), PartitionView("other", ("a",))],
               policy=Policy())
    assert set(starts(easy)) == {2} and reasons(easy) == {1: Reason.RESOURCES}


def test_partitions_block_independently() -> None:
    parts = [PartitionView("gpu", ("a",)), PartitionView("debug", ("b",))]
    p = run([node("a", 1), node("b", 1)], [job(1, 1), job(2, 1), job(3, 1, "debug")],
            partitions=parts)
    assert set(starts(p)) == {1, 3}
    assert reasons(p) == {2: Reason.RESOURCES}


def test_nodelist_and_exclude_choose_the_nodes() -> None:
    """-w runs a job on exactly the nodes it names, -x never on those it excludes; a job
    that cannot start there does not stop a like job elsewhere (groups of their own)."""
    from dataclasses import replace

    nodes = [node("a", 2), node("b", 2), node("c", 2)]
    jobs = [replace(job(1, 2), nodelist=("c",)), replace(job(2, 1), exclude=("a", "b")),
            replace(job(3, 2), nodelist=("c",)), job(4, 2), job(5, 1, submit=6),
            replace(job(6, 1), nodelist=("gone",)),
            replace(job(7, 1, submit=7), nodelist=("a", "b"), nodes=2)]
    p = run(nodes, jobs, policy=Policy())
    assert starts(p) == {1: ("c", ("c-g0", "c-g1")), 4: ("a", ("a-g0", "a-g1")),
                         5: ("b", ("b-g0",))}
    # Job 3 (2 GPUs) outranks job 2 (1 GPU) by size: it is the first to wait.
    assert reasons(p) == {2: Reason.PRIORITY, 3: Reason.RESOURCES, 6: Reason.PRIORITY,
                          7: Reason.PRIORITY}
    both = run(nodes[:2], [replace(job(8, 1), nodelist=("a", "b"), nodes=2)])
    assert [(s.job_id, s.nodes) for s in both.starts] == [(8, ("a", "b"))]


def test_down_or_missing_partition() -> None:
    parts = [PartitionView("gpu", ("a",), up=False)]
    p = run([node("a", 1)], [job(1, 1), job(2, 1, "gone")], partitions=parts)
    assert reasons(p) == {1: Reason.PARTITION_DOWN, 2: Reason.PARTITION_DOWN}


def test_zero_gpu_job_starts_without_gpus() -> None:
    p = run([node("a", 1)], [job(1, 1), job(2, 0)])
    assert starts(p) == {1: ("a", ("a-g0",)), 2: ("a", ())}


def test_an_exclusive_job_takes_a_whole_idle_node() -> None:
    """It gets every GPU of the node, starts only where nothing runs, and nothing else
    (not even a job without GPUs) joins it, in this pass or later ones."""
    from dataclasses import replace

    nodes = [node("a", 4), node("b", 4), node("c", 4)]
    cpu_job = RunningJob(90, "c", ())  # holds no GPU, but c is not idle
    p = run(nodes, [replace(job(1, 1), exclusive=True), job(2, 1), job(3, 0),
                    replace(job(4, 1), exclusive=True)], running=[cpu_job], policy=IN_ORDER)
    assert starts(p) == {1: ("a", ("a-g0", "a-g1", "a-g2", "a-g3")), 2: ("b", ("b-g0",)),
                         3: ("b", ())}
    assert reasons(p) == {4: Reason.RESOURCES}  # b and c are not idle
    later = RunningJob(1, "a", ("a-g0", "a-g1", "a-g2", "a-g3"), end_time=100.0, exclusive=True)
    p = run(nodes[:1], [job(5, 0), job(6, 1)], running=[later], policy=IN_ORDER)
    assert starts(p) == {}


def test_an_exclusive_job_without_gpus_holds_every_gpu_of_its_node() -> None:
    """As Slurm's --exclusive: all the GRES of the node, though it asked for none; a
    node without GPUs is taken first."""
    from dataclasses import replace

    p = run([node("a", 2)], [replace(job(1, 0), exclusive=True)])
    assert starts(p) == {1: ("a", ("a-g0", "a-g1"))}
    p = run([node("a", 2), node("c", 0)], [replace(job(1, 0), exclusive=True)])
    assert starts(p) == {1: ("c", ())}


def test_an_exclusive_job_reserves_the_node_and_short_jobs_backfill() -> None:
    from dataclasses import replace

    busy = RunningJob(90, "a", ("a-g0", "a-g1"), end_time=50.0)
    p = run([node("a", 4)], [replace(job(1, 1, submit=1), exclusive=True, time_limit=100),
                             replace(job(2, 1, submit=2), time_limit=10),
                             replace(job(3, 1, submit=3), time_limit=100)],
            running=[busy], policy=IN_ORDER)
    assert [(r.job_id, r.start_time) for r in p.reservations] == [(1, 50.0)]
    assert set(starts(p)) == {2}  # ends before the reservation; job 3 would not
    assert reasons(p) == {1: Reason.RESOURCES, 3: Reason.PRIORITY}


# --- properties -------------------------------------------------------------------------

snapshots = st.builds(
    lambda sizes, health, reqs, held: _snapshot(sizes, health, reqs, held),
    st.lists(st.integers(0, 8), min_size=1, max_size=5),
    st.lists(st.booleans(), min_size=40, max_size=40),
    st.lists(st.tuples(st.integers(0, 9), st.sampled_from(["p", "q"]), st.integers(0, 3)),
             max_size=30),
    st.lists(st.integers(0, 39), max_size=10, unique=True),
)


def _snapshot(sizes: list[int], health: list[bool], reqs: list[tuple[int, str, int]],
              held: list[int]) -> Snapshot:
    nodes, flat = [], []
    for n, size in enumerate(sizes):
        gpus = tuple(GpuView(f"n{n}-{i}", i, health[(n * 8 + i) % 40]) for i in range(size))
        state = {3: NodeState.DOWN, 4: NodeState.DRAIN}.get(n, NodeState.UP)
        nodes.append(NodeView(f"n{n}", state, gpus))
        flat += [(f"n{n}", g.uuid) for g in gpus]
    running = tuple(RunningJob(1000 + i, flat[i][0], (flat[i][1],)) for i in held if i < len(flat))
    names = tuple(n.name for n in nodes)
    parts = (PartitionView("p", names), PartitionView("q", names[::-1]))
    pending = tuple(PendingJob(i + 1, part, gpus, 1000, float(t)) for i, (gpus, part, t) in enumerate(reqs))
    return Snapshot(tuple(nodes), parts, pending, running)


@settings(max_examples=200, deadline=None)
@given(snapshots, st.sets(st.integers(1, 30)))
def test_an_exclusive_job_never_shares_a_node(snapshot: Snapshot, exclusive: set[int]) -> None:
    from dataclasses import replace

    snapshot = replace(snapshot, pending=tuple(
        replace(j, exclusive=j.job_id in exclusive) for j in snapshot.pending))
    result = plan(snapshot, 0.0, Policy())
    on: dict[str, list[int]] = {}
    for r in snapshot.running:
        on.setdefault(r.node, []).append(r.job_id)
    for start in result.starts:
        on.setdefault(start.node, []).append(start.job_id)
    sizes = {n.name: sum(1 for g in n.gpus if g.healthy) for n in snapshot.nodes}
    for start in result.starts:
        if start.job_id in exclusive:
            assert on[start.node] == [start.job_id]
            if start.gpu_uuids:  # every healthy GPU of its node
                assert len(start.gpu_uuids) == sizes[start.node]


@settings(max_examples=300, deadline=None)
@given(snapshots)
def test_no_gpu_is_given_twice_or_when_unusable(snapshot: Snapshot) -> None:
    result = plan(snapshot, 0.0, Policy())
    held = {u for r in snapshot.running for u in r.gpu_uuids}
    usable = {g.uuid for n in snapshot.nodes if n.state is NodeState.UP for g in n.gpus if g.healthy}
    given_out = [u for s in result.starts for u in s.gpu_uuids]
    assert len(given_out) == len(set(given_out))
    assert not set(given_out) & held
    assert set(given_out) <= usable
    by_id = {j.job_id: j for j in snapshot.pending}
    for s in result.starts:
        assert len(s.gpu_uuids) == by_id[s.job_id].gpus
        assert all(u.startswith(s.node + "-") for u in s.gpu_uuids)
    decided = [s.job_id for s in result.starts] + [p.job_id for p in result.pending]
    assert sorted(decided) == sorted(by_id)


@settings(max_examples=100, deadline=None)
@given(snapshots)
def test_plans_are_deterministic(snapshot: Snapshot) -> None:
    assert plan(snapshot, 0.0, Policy()) == plan(snapshot, 0.0, Policy())


# --- priority order ----------------------------------------------------------------------


def _accounted(jobs: list[PendingJob], usage: dict[tuple[str, str], float],
               qos: dict[str, int] | None = None) -> Snapshot:
    return Snapshot(
        (node("a", 1),), (PartitionView("gpu", ("a",)),), tuple(jobs),
        accounts=(Account("lab", "root"),),
        user_shares=(UserShare("alice", "lab"), UserShare("bob", "lab")),
        usage=usage, qos_priority=qos or {},
    )


def _pending(job_id: int, user: str, submit: float, qos: str | None = None) -> PendingJob:
    return PendingJob(job_id, "gpu", 1, 1000, submit, user=user, account="lab", qos=qos)


def test_fair_share_puts_the_lighter_user_first() -> None:
    jobs = [_pending(1, "alice", 0.0), _pending(2, "bob", 10.0)]
    heavy_alice = _accounted(jobs, {("alice", "lab"): 5000.0, ("bob", "lab"): 100.0})
    p = plan(heavy_alice, 60.0, Policy())
    assert [s.job_id for s in p.starts] == [2] and reasons(p) == {1: Reason.RESOURCES}
    heavy_bob = _accounted(jobs, {("alice", "lab"): 100.0, ("bob", "lab"): 5000.0})
    assert [s.job_id for s in plan(heavy_bob, 60.0, Policy()).starts] == [1]


def test_qos_priority_outranks_age() -> None:
    jobs = [_pending(1, "alice", 0.0, "normal"), _pending(2, "alice", 10.0, "high")]
    snapshot = _accounted(jobs, {}, {"normal": 10, "high": 100})
    assert [s.job_id for s in plan(snapshot, 60.0, Policy()).starts] == [2]


def test_zero_weights_mean_submit_order() -> None:
    jobs = [_pending(2, "alice", 0.0), _pending(1, "bob", 10.0)]
    snapshot = _accounted(jobs, {("alice", "lab"): 5000.0})
    zero = Policy(weights=PriorityWeights(age=0, fairshare=0, job_size=0, partition=0, qos=0))
    assert [s.job_id for s in plan(snapshot, 60.0, zero).starts] == [2]


def test_classic_and_fair_tree_can_order_differently() -> None:
    accounts = (Account("physics", "root", 60), Account("bio", "root", 40),
                Account("theory", "physics"), Account("exp", "physics"))
    shares = (UserShare("alice", "theory"), UserShare("bob", "exp"), UserShare("carol", "exp"),
              UserShare("dave", "bio"))
    # physics (60 shares) and bio (40) used alike: Fair Tree puts all of physics first,
    # bob among them; classic weighs bob's small normalised share (.15, effective usage
    # .25) against dave's (.4, .5): 2^-(.25/.15) < 2^-(.5/.4), dave first.
    usage = {("carol", "exp"): 100.0, ("dave", "bio"): 100.0}
    jobs = (PendingJob(1, "gpu", 1, 1000, 0.0, user="bob", account="exp"),
            PendingJob(2, "gpu", 1, 1000, 0.0, user="dave", account="bio"))
    snapshot = Snapshot((node("a", 1),), (PartitionView("gpu", ("a",)),), jobs,
                        accounts=accounts, user_shares=shares, usage=usage)
    assert [s.job_id for s in plan(snapshot, 0.0, Policy()).starts] == [1]
    assert [s.job_id for s in plan(snapshot, 0.0, Policy(fairshare="classic")).starts] == [2]


_partitions = st.builds(
    PartitionView, name=st.just("p"), nodes=st.just(("n1",)), up=st.booleans(),
    max_time=st.none() | st.integers(1, 100), allow_accounts=st.none() | st.just(frozenset({"a"})),
    deny_accounts=st.sampled_from([frozenset(), frozenset({"b"})]),
    max_gpus_per_job=st.none() | st.integers(0, 4))
_jobs = st.builds(
    PendingJob, job_id=st.just(1), partition=st.just("p"), gpus=st.integers(0, 6),
    uid=st.just(0), submit_time=st.just(0.0), time_limit=st.none() | st.integers(1, 200),
    user=st.just("u"), account=st.sampled_from([None, "a", "b"]),
    qos=st.sampled_from([None, "q"]), hold=st.sampled_from([None, "user", "admin"]),
    begin_time=st.none() | st.floats(0, 20), dependency=st.sampled_from([None, "singleton"]),
    name=st.just("j"), array_job_id=st.sampled_from([None, 1]),
    array_max_running=st.none() | st.integers(0, 2))


@settings(max_examples=300, deadline=None)
@given(_partitions, _jobs)
def test_an_open_partition_holds_no_job_back(part: PartitionView, job: PendingJob) -> None:
    """``partition_open`` lets jobs skip ``partition_waits``: only where it finds nothing."""
    from gpusched.core.waits import partition_open, partition_waits

    if partition_open(part):
        assert list(partition_waits(job, part)) == []


@settings(max_examples=300, deadline=None)
@given(_jobs)
def test_a_plain_job_has_no_reason_to_wait(job: PendingJob) -> None:
    """``_plain`` lets most jobs skip ``waits``: only where it would find nothing."""
    from gpusched.core.model import QosLimits
    from gpusched.core.plan import SchedulingPass

    snapshot = Snapshot((node("n1", 4),), (PartitionView("p", ("n1",)),), (job,),
                        running=(RunningJob(9, "n1", ("n1-g0",), user="u", qos="q",
                                            array_job_id=1),),
                        qos_limits={"q": QosLimits(max_jobs_per_user=1)},
                        running_names=frozenset({("u", "j")}))
    scheduling = SchedulingPass(snapshot, 10.0, Policy())
    if scheduling._plain(job):
        assert list(scheduling.waits(job)) == []
