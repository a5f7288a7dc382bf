"""One scheduling pass: ``plan(snapshot, now, policy) -> Plan``."""

from __future__ import annotations

from gpusched.core.dependency import dependency_clauses, dependency_reason
from gpusched.core.fairshare import FairShareTree
from gpusched.core.limits import LimitTracker
from gpusched.core.model import (
    NodeView,
    Pending,
    PendingJob,
    Plan,
    Policy,
    Reason,
    Snapshot,
    Start,
)
from gpusched.core.placement import first_fit, free_gpus_by_node
from gpusched.core.priority import (
    PriorityBreakdown,
    PriorityInput,
    PriorityScale,
    priorities,
)


def fairshare_factors(snapshot: Snapshot, policy: Policy) -> dict[tuple[str, str], float]:
    """Each user association's fair-share factor (empty when no tree is configured)."""
    if not snapshot.user_shares or policy.weights.fairshare == 0:
        return {}
    tree = FairShareTree(snapshot.accounts, snapshot.user_shares)
    if policy.fairshare == "classic":
        return tree.classic(snapshot.usage)
    return tree.fair_tree(snapshot.usage)


def job_priorities(snapshot: Snapshot, now: float, policy: Policy) -> list[PriorityBreakdown]:
    """Every pending job's priority factors, highest first (ties: lower job id first)."""
    factors = fairshare_factors(snapshot, policy)
    tiers = {p.name: p.tier for p in snapshot.partitions}
    scale = PriorityScale(
        cluster_gpus=sum(len(n.gpus) for n in snapshot.nodes),
        max_partition_tier=max(tiers.values(), default=0),
        max_qos_priority=max(snapshot.qos_priority.values(), default=0),
    )
    inputs = (
        PriorityInput(job.job_id, job.eligible_time, job.gpus,
                      # Jobs charging no account (none configured) are all treated alike.
                      factors.get((job.user, job.account), 1.0) if job.account else 1.0,
                      tiers.get(job.partition, 0), snapshot.qos_priority.get(job.qos or "", 0))
        for job in snapshot.pending
    )
    return priorities(inputs, now, policy.weights, scale)


def queue_order(snapshot: Snapshot, now: float, policy: Policy) -> list[PendingJob]:
    """Pending jobs by multifactor priority; equal priorities in submit order."""
    by_id = {job.job_id: job for job in snapshot.pending}
    ranked = job_priorities(snapshot, now, policy)
    rank = {b.job_id: (-b.total, by_id[b.job_id].submit_time, b.job_id) for b in ranked}
    return sorted(snapshot.pending, key=lambda job: rank[job.job_id])


def _not_eligible(job: PendingJob, now: float) -> Reason | None:
    """A hold or a begin time still in the future."""
    if job.hold == "admin":
        return Reason.JOB_HELD_ADMIN
    if job.hold is not None:
        return Reason.JOB_HELD_USER
    if job.begin_time is not None and job.begin_time > now:
        return Reason.BEGIN_TIME
    return None


def _dependency(job: PendingJob, snapshot: Snapshot, busy: set[tuple[str, str]]) -> Reason | None:
    if not job.dependency:
        return None
    return dependency_reason(dependency_clauses(job.dependency), snapshot.job_states,
                             (job.user, job.name) in busy)


def plan(snapshot: Snapshot, now: float, policy: Policy) -> Plan:
    """Decide which pending jobs start now, where, and why the others wait.

    Jobs are taken in priority order (``queue_order``). A job that is held, waits for
    its begin time or its dependencies, or is at its QOS limit waits with that reason
    and blocks nobody. Within a partition
    the first job that cannot be placed blocks the ones behind it (reason ``Priority``),
    so a large job is never overtaken indefinitely; placement is the first node with
    enough free GPUs.
    """
    nodes_by_name = {node.name: node for node in snapshot.nodes}
    partitions = {part.name: part for part in snapshot.partitions}
    free = free_gpus_by_node(snapshot.nodes, snapshot.running)
    limits = LimitTracker(snapshot.qos_limits, snapshot.running)
    busy_names = set(snapshot.running_names)
    blocked: set[str] = set()
    starts: list[Start] = []
    pending: list[Pending] = []

    for job in queue_order(snapshot, now, policy):
        partition = partitions.get(job.partition)
        if partition is None or not partition.up:
            pending.append(Pending(job.job_id, Reason.PARTITION_DOWN))
            continue
        held_back = (_not_eligible(job, now) or _dependency(job, snapshot, busy_names)
                     or limits.blocking(job))
        if held_back is not None:
            # A held job, or one held by its own QOS limit, holds back nobody behind it.
            pending.append(Pending(job.job_id, held_back))
            continue
        if job.partition in blocked or len(starts) >= policy.max_starts_per_pass:
            pending.append(Pending(job.job_id, Reason.PRIORITY))
            continue
        candidates: list[NodeView] = [
            nodes_by_name[name] for name in partition.nodes if name in nodes_by_name
        ]
        placed = first_fit(candidates, free, job.gpus, job.uid)
        if placed is None:
            blocked.add(job.partition)
            pending.append(Pending(job.job_id, Reason.RESOURCES))
            continue
        node_name, gpus = placed
        taken = {gpu.uuid for gpu in gpus}
        free[node_name] = [gpu for gpu in free[node_name] if gpu.uuid not in taken]
        starts.append(Start(job.job_id, node_name, tuple(gpu.uuid for gpu in gpus)))
        limits.started(job)
        busy_names.add((job.user, job.name))

    return Plan(starts=tuple(starts), pending=tuple(pending))
