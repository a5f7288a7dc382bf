"""The database side of a scheduling pass: load a Snapshot in bulk, apply a Plan."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Table, bindparam, insert, select, update
from sqlalchemy.orm import Session

from gpusched.core.dependency import dependency_clauses
from gpusched.core.fairshare import Account as CoreAccount
from gpusched.core.fairshare import UserShare
from gpusched.core.model import (
    GpuView,
    JobState,
    NodeState,
    NodeView,
    PartitionView,
    PendingJob,
    Plan,
    QosLimits,
    Reason,
    RunningJob,
    Snapshot,
)
from gpusched.db.engine import rowcount
from gpusched.db.models import (
    Account,
    AccountUser,
    Allocation,
    FairShareUsage,
    Gpu,
    Job,
    Node,
    Partition,
    Qos,
)


def _nodes(session: Session) -> tuple[tuple[NodeView, ...], dict[str, int]]:
    """Nodes with their usable GPUs in index order, and node ids by name."""
    node_rows = session.execute(select(Node.id, Node.name, Node.state, Node.run_uid)
                                .order_by(Node.name)).all()
    gpus: dict[int, list[GpuView]] = {}
    for node_id, index, uuid, healthy in session.execute(
        select(Gpu.node_id, Gpu.index, Gpu.uuid, Gpu.healthy)
        .where(Gpu.present, Gpu.parent_id.is_(None))
    ):
        gpus.setdefault(node_id, []).append(GpuView(uuid, index, healthy))
    nodes = tuple(
        NodeView(name, NodeState(state), tuple(sorted(gpus.get(nid, []), key=lambda g: g.index)),
                 run_uid)
        for nid, name, state, run_uid in node_rows
    )
    return nodes, {name: nid for nid, name, _, _ in node_rows}


def _partitions(session: Session, all_names: tuple[str, ...]) -> tuple[PartitionView, ...]:
    return tuple(
        # DRAIN refuses new submissions but still runs what is queued (as in Slurm).
        PartitionView(name, all_names if "*" in members else tuple(members),
                      state in ("UP", "DRAIN"), tier)
        for name, members, state, tier in session.execute(
            select(Partition.name, Partition.nodes, Partition.state, Partition.priority_tier)
            .order_by(Partition.name))
    )


def _pending(session: Session) -> tuple[PendingJob, ...]:
    return tuple(
        PendingJob(jid, part, n, uid, submitted.timestamp(), limit, Reason(reason), user,
                   account, qos, hold, begin.timestamp() if begin else None, dependency, name)
        for jid, part, n, uid, submitted, limit, reason, user, account, qos, hold, begin,
        dependency, name in session.execute(
            select(Job.id, Job.partition, Job.gpus, Job.uid, Job.submit_time, Job.time_limit,
                   Job.reason, Job.user_name, Job.account, Job.qos, Job.hold, Job.begin_time,
                   Job.dependency, Job.name)
            .where(Job.state == "PENDING"))
    )


def _running(session: Session) -> tuple[tuple[RunningJob, ...], frozenset[tuple[str, str]]]:
    """Running jobs with their GPUs, and the (user, name) pairs singleton checks."""
    gpus_of: dict[int, list[str]] = {}
    for job_id, uuid in session.execute(
        select(Allocation.job_id, Gpu.uuid).join(Gpu, Gpu.id == Allocation.gpu_id)
        .where(Allocation.released_at.is_(None)).order_by(Allocation.job_id, Gpu.index)
    ):
        gpus_of.setdefault(job_id, []).append(uuid)
    # From the jobs table, not the allocations: a job without GPUs counts toward job limits.
    rows = session.execute(
        select(Job.id, Node.name, Job.user_name, Job.account, Job.qos, Job.name)
        .join(Node, Node.id == Job.node_id).where(Job.state == "RUNNING")).all()
    running = tuple(RunningJob(job_id, node, tuple(gpus_of.get(job_id, ())), user, account, qos)
                    for job_id, node, user, account, qos, _ in rows)
    return running, frozenset((user, name) for _, _, user, _, _, name in rows)


def _dependency_states(session: Session, pending: tuple[PendingJob, ...]) -> dict[int, JobState]:
    named = {j for job in pending if job.dependency for c in dependency_clauses(job.dependency)
             for j in c.job_ids}
    if not named:
        return {}
    return {job_id: JobState(state) for job_id, state in session.execute(
        select(Job.id, Job.state).where(Job.id.in_(named)))}


def load_snapshot(session: Session) -> tuple[Snapshot, dict[str, int]]:
    """Everything a pass needs, in a handful of queries; also node ids by name."""
    nodes, node_ids = _nodes(session)
    pending = _pending(session)
    running, running_names = _running(session)
    qos_rows = session.execute(select(Qos.name, Qos.priority, Qos.max_gpus_per_user,
                                      Qos.max_jobs_per_user, Qos.grp_gpus)).all()
    snapshot = Snapshot(
        nodes=nodes, partitions=_partitions(session, tuple(node_ids)), pending=pending,
        running=running,
        accounts=tuple(CoreAccount(name, parent, shares) for name, parent, shares in session.execute(
            select(Account.name, Account.parent, Account.shares)) if name != "root"),
        user_shares=tuple(UserShare(user, account, shares) for user, account, shares in
                          session.execute(select(AccountUser.user_name, AccountUser.account,
                                                 AccountUser.shares))),
        usage={(u, a): value for u, a, value in session.execute(
            select(FairShareUsage.user_name, FairShareUsage.account, FairShareUsage.usage))},
        qos_priority={name: priority for name, priority, *_ in qos_rows},
        qos_limits={name: QosLimits(gpus, jobs, grp) for name, _, gpus, jobs, grp in qos_rows},
        job_states=_dependency_states(session, pending),
        running_names=running_names,
    )
    return snapshot, node_ids


def apply_plan(session: Session, snapshot: Snapshot, plan: Plan,
               node_ids: dict[str, int]) -> set[str]:
    """Write the plan with guarded UPDATEs; returns the nodes that got jobs to launch.

    A start whose job is no longer PENDING (cancelled since the snapshot) is skipped.
    The partial unique index on allocations turns any double allocation into an error
    that rolls the whole pass back.
    """
    now = datetime.now(UTC)
    woken: set[str] = set()
    gpu_ids = dict(session.execute(select(Gpu.uuid, Gpu.id).where(
        Gpu.uuid.in_([u for start in plan.starts for u in start.gpu_uuids]))).all()
    ) if plan.starts else {}
    for start in plan.starts:
        node_id = node_ids[start.node]
        started = rowcount(session.execute(
            update(Job).where(Job.id == start.job_id, Job.state == "PENDING")
            .values(state="RUNNING", reason="None", start_time=now, node_id=node_id)
        ))
        if not started:
            continue
        if start.gpu_uuids:
            session.execute(insert(Allocation), [
                {"job_id": start.job_id, "gpu_id": gpu_ids[u], "node_id": node_id,
                 "allocated_at": now}
                for u in start.gpu_uuids
            ])
        woken.add(start.node)
    current = {job.job_id: job.reason for job in snapshot.pending}
    changed = [{"jid": p.job_id, "r": p.reason.value} for p in plan.pending
               if current.get(p.job_id) != p.reason]
    if changed:
        # Core executemany (one statement, many parameter sets), not an ORM bulk update.
        jobs_table = Job.__table__
        assert isinstance(jobs_table, Table)
        session.connection().execute(
            update(jobs_table).where(jobs_table.c.id == bindparam("jid"),
                                     jobs_table.c.state == "PENDING")
            .values(reason=bindparam("r")),
            changed,
        )
    return woken
