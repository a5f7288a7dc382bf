"""GPU health: agents report failing GPUs and MIG slices; they leave service at once and
the jobs on them are stopped, to be requeued or to end FAILED."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpusched.db.models import Allocation, Gpu, Job, Node, Partition
from gpusched.errors import NotFound, UsageError

MAX_REASON = 500


def _faults(body: dict[str, Any]) -> list[tuple[str, str]]:
    faults = body.get("faults", [])
    if not isinstance(faults, list) or not all(
            isinstance(f, dict) and isinstance(f.get("uuid"), str)
            and isinstance(f.get("reason"), str) and f["reason"] for f in faults):
        raise UsageError("faults: expected a list of {uuid, reason}")
    return [(f["uuid"], f["reason"][:MAX_REASON]) for f in faults]


def report_faults(session: Session, node_name: str, body: dict[str, Any]) -> set[str]:
    """Take the failing GPUs and slices of ``body`` out of service; the nodes whose jobs
    must now be stopped.

    A failing GPU takes its MIG slices with it; a failing slice is only itself. A job
    holding any of them is asked to stop (``cancel_requested_at``) and remembers why in
    ``gpu_failure``; how it ends is decided when its end is recorded.
    """
    faults = _faults(body)
    node = session.scalars(select(Node).where(Node.name == node_name)).first()
    if node is None:
        raise NotFound(f"unknown node {node_name!r}: the agent must register first")
    now = datetime.now(UTC)
    stopping: set[str] = set()
    for uuid, reason in faults:
        gpu = session.scalars(select(Gpu).where(Gpu.uuid == uuid, Gpu.node_id == node.id)).first()
        if gpu is None:
            raise UsageError(f"faults: {uuid} is not a GPU of node {node_name}")
        affected = [gpu.id, *session.scalars(select(Gpu.id).where(Gpu.parent_id == gpu.id))]
        session.execute(update(Gpu).where(Gpu.id.in_(affected), Gpu.healthy)
                        .values(healthy=False, health_reason=reason, unhealthy_at=now))
        failure = f"GPU {node_name}:{gpu.index} ({uuid}) failed: {reason}"
        holders = select(Allocation.job_id).where(Allocation.gpu_id.in_(affected),
                                                  Allocation.released_at.is_(None))
        for job in session.scalars(select(Job).where(Job.id.in_(holders), Job.state == "RUNNING")):
            if job.gpu_failure is None:
                job.gpu_failure = failure
            job.cancel_requested_at = job.cancel_requested_at or now
            stopping.update(job.node_names or [node_name])
    return stopping


def resume_gpu(session: Session, node_name: str, index: int) -> dict[str, Any]:
    """Return a GPU (with its slices) or one slice to service."""
    gpu = session.scalars(select(Gpu).join(Node, Node.id == Gpu.node_id).where(
        Node.name == node_name, Gpu.index == index, Gpu.present)).first()
    if gpu is None:
        raise NotFound(f"node {node_name} has no GPU with index {index}")
    affected = [gpu.id, *session.scalars(select(Gpu.id).where(Gpu.parent_id == gpu.id))]
    session.execute(update(Gpu).where(Gpu.id.in_(affected))
                    .values(healthy=True, health_reason=None, unhealthy_at=None))
    return {"node": node_name, "index": index, "uuid": gpu.uuid, "healthy": True}


def resume_after(session: Session, clean: float) -> list[str]:
    """GPUs out of service for ``clean`` seconds return (their agents report them again
    if they still fail); the UUIDs returned."""
    cutoff = datetime.now(UTC) - timedelta(seconds=clean)
    return list(session.scalars(
        update(Gpu).where(Gpu.healthy.is_(False), Gpu.unhealthy_at < cutoff)
        .values(healthy=True, health_reason=None, unhealthy_at=None).returning(Gpu.uuid)))


def may_requeue(session: Session, job: Job) -> bool:
    """Whether a job whose GPU failed goes back to the queue: its own ``--requeue`` or
    ``--no-requeue``, else its partition's default."""
    if job.requeue is not None:
        return job.requeue
    default = session.scalar(select(Partition.requeue).where(Partition.name == job.partition))
    return True if default is None else bool(default)

