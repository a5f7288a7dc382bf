"""One scheduling pass: ``plan(snapshot, now, policy) -> Plan``."""

from __future__ import annotations

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


def queue_order(jobs: tuple[PendingJob, ...]) -> list[PendingJob]:
    """Submit order; the job id breaks ties so the order is total."""
    return sorted(jobs, key=lambda job: (job.submit_time, job.job_id))


def plan(snapshot: Snapshot, now: float, policy: Policy) -> Plan:
    """Decide which pending jobs start now, where, and why the others wait.

    Jobs are taken in queue order. Within a partition the first job that cannot be
    placed blocks the ones behind it (reason ``Priority``), so a large job is never
    overtaken indefinitely; placement is the first node with enough free GPUs.
    """
    del now  # used by later policies (age, reservations); kept for a stable signature
    nodes_by_name = {node.name: node for node in snapshot.nodes}
    partitions = {part.name: part for part in snapshot.partitions}
    free = free_gpus_by_node(snapshot.nodes, snapshot.running)
    blocked: set[str] = set()
    starts: list[Start] = []
    pending: list[Pending] = []

    for job in queue_order(snapshot.pending):
        partition = partitions.get(job.partition)
        if partition is None or not partition.up:
            pending.append(Pending(job.job_id, Reason.PARTITION_DOWN))
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

    return Plan(starts=tuple(starts), pending=tuple(pending))
