"""QOS limits in the pass: the right reason, and never a start that breaks one."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.model import (
    GpuView,
    NodeState,
    NodeView,
    PartitionView,
    PendingJob,
    Policy,
    QosLimits,
    Reason,
    RunningJob,
    Snapshot,
)
from gpusched.core.plan import plan


def node(name: str, gpus: int) -> NodeView:
    return NodeView(name, NodeState.UP, tuple(GpuView(f"{name}-{i}", i) for i in range(gpus)))


def pending(job_id: int, user: str, gpus: int, account: str = "lab", qos: str = "normal") -> PendingJob:
    return PendingJob(job_id, "gpu", gpus, 1000, float(job_id), user=user, account=account, qos=qos)


def decide(jobs: list[PendingJob], limits: QosLimits, running: tuple[RunningJob, ...] = ()) -> tuple[list[int], dict[int, Reason]]:
    snapshot = Snapshot((node("a", 8),), (PartitionView("gpu", ("a",)),), tuple(jobs), running,
                        qos_limits={"normal": limits})
    result = plan(snapshot, 100.0, Policy())
    return [s.job_id for s in result.starts], {p.job_id: p.reason for p in result.pending}


def test_max_gpus_per_user_holds_only_that_users_next_job() -> None:
    started, reasons = decide([pending(1, "alice", 3), pending(2, "alice", 2), pending(3, "bob", 2)],
                              QosLimits(max_gpus_per_user=4))
    assert started == [1, 3] and reasons == {2: Reason.QOS_MAX_GPUS_PER_USER}


def test_max_jobs_per_user_counts_running_jobs_too() -> None:
    running = (RunningJob(9, "a", ("a-7",), user="alice", account="lab", qos="normal"),)
    started, reasons = decide([pending(1, "alice", 1), pending(2, "alice", 1), pending(3, "bob", 1)],
                              QosLimits(max_jobs_per_user=2), running)
    assert started == [1, 3] and reasons == {2: Reason.QOS_MAX_JOBS_PER_USER}


def test_group_gpu_limit_is_per_account() -> None:
    jobs = [pending(1, "alice", 2), pending(2, "bob", 2), pending(3, "carol", 2, account="other")]
    started, reasons = decide(jobs, QosLimits(grp_gpus=3))
    assert started == [1, 3] and reasons == {2: Reason.QOS_GRP_GPUS}


def test_a_limited_job_does_not_block_the_partition() -> None:
    started, reasons = decide([pending(1, "alice", 5), pending(2, "bob", 4)], QosLimits(max_gpus_per_user=4))
    assert reasons[1] == Reason.QOS_MAX_GPUS_PER_USER and started == [2]


@st.composite
def limited_snapshots(draw: st.DrawFn) -> Snapshot:
    limits = {q: QosLimits(draw(st.none() | st.integers(0, 6)), draw(st.none() | st.integers(0, 3)),
                           draw(st.none() | st.integers(0, 8))) for q in ("normal", "low")}
    users, accounts = ["u1", "u2", "u3"], ["x", "y"]
    jobs = tuple(PendingJob(i, "gpu", draw(st.integers(0, 4)), 1000, float(i),
                            user=draw(st.sampled_from(users)), account=draw(st.sampled_from(accounts)),
                            qos=draw(st.sampled_from(["normal", "low"])))
                 for i in range(draw(st.integers(0, 25))))
    held = draw(st.lists(st.tuples(st.sampled_from(users), st.sampled_from(accounts),
                                   st.sampled_from(["normal", "low"])), max_size=4))
    nodes = (node("a", 8), node("b", 8))
    running = tuple(RunningJob(100 + i, "b", (f"b-{i}",), u, a, q) for i, (u, a, q) in enumerate(held))
    return Snapshot(nodes, (PartitionView("gpu", ("a", "b")),), jobs, running, qos_limits=limits)


@settings(max_examples=300, deadline=None)
@given(limited_snapshots())
def test_no_start_ever_breaks_a_limit(snapshot: Snapshot) -> None:
    result = plan(snapshot, 100.0, Policy())
    by_id = {j.job_id: j for j in snapshot.pending}
    user_gpus: Counter[tuple[str, str]] = Counter()
    user_jobs: Counter[tuple[str, str]] = Counter()
    acct_gpus: Counter[tuple[str, str]] = Counter()
    for r in snapshot.running:
        assert r.qos is not None and r.account is not None
        user_gpus[(r.qos, r.user)] += 1
        user_jobs[(r.qos, r.user)] += 1
        acct_gpus[(r.qos, r.account)] += 1
    for s in result.starts:
        job = by_id[s.job_id]
        assert job.qos is not None and job.account is not None
        user_gpus[(job.qos, job.user)] += job.gpus
        user_jobs[(job.qos, job.user)] += 1
        acct_gpus[(job.qos, job.account)] += job.gpus
        limits = snapshot.qos_limits[job.qos]
        # Every counter a start raised must be within its limit.
        if limits.max_gpus_per_user is not None and job.gpus:
            assert user_gpus[(job.qos, job.user)] <= limits.max_gpus_per_user
        if limits.max_jobs_per_user is not None:
            assert user_jobs[(job.qos, job.user)] <= limits.max_jobs_per_user
        if limits.grp_gpus is not None and job.gpus:
            assert acct_gpus[(job.qos, job.account)] <= limits.grp_gpus
