"""GPU health: agents report failing GPUs and MIG slices; they leave service at once and
the jobs on them are stopped, to be requeued or to end FAILED."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpusched.db import commands
from gpusched.db.models import Allocation, Gpu, Job, Node, Partition
from gpusched.db.nodes import unregistered
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
    holding any of them is asked to stop (``cancel_requested_at`` and a ``cancel``
    command to the node running its batch script) and remembers why in
    ``gpu_failure``; how it ends is decided when its end is recorded.
    """
    faults = _faults(body)
    node = session.scalars(select(Node).where(Node.name == node_name)).first()
    if node is None:
        raise unregistered(node_name)
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
            if job.cancel_requested_at is None and job.node_id is not None:
                job.cancel_requested_at = now
                commands.issue(session, "cancel", [(job.id, job.restarts, job.node_id)])
            stopping.update(job.node_names or [node_name])
    return stopping


def resume_gpu(session: Session, node_name: str, index: int) -> dict[str, Any]:
    """Return a GPU (with its slices) or one slice to service."""
    gpu = _gpu(session, node_name, index)
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



def _samples(body: dict[str, Any]) -> list[dict[str, Any]]:
    samples: Any = body.get("gpus", [])
    keys = ("util", "mem_used_mb", "temperature", "power_mw")
    if not isinstance(samples, list) or not all(
            isinstance(g, dict) and isinstance(g.get("uuid"), str)
            and all(isinstance(g.get(k), int) and not isinstance(g.get(k), bool) and g[k] >= 0
                    for k in keys) for g in samples):
        raise UsageError("gpus: expected a list of {uuid, util, mem_used_mb, temperature, power_mw}")
    return samples


def record_samples(session: Session, node_name: str, body: dict[str, Any],
                   idle_percent: float, idle_after: float) -> list[int]:
    """Store each GPU's latest sample and roll it up into the jobs holding it; the jobs
    newly flagged idle (GPUs at most ``idle_percent`` busy for ``idle_after`` seconds).

    A job on MIG slices is charged its parent GPU's sample (NVML gives utilisation per
    GPU, not per slice). ``idle_since`` is when its GPUs were first seen idle in this
    run; the idle-GPU policy (db/idle_policy.py) acts on it.
    """
    samples = _samples(body)
    node = session.scalars(select(Node).where(Node.name == node_name)).first()
    if node is None:
        raise unregistered(node_name)
    now = datetime.now(UTC)
    by_uuid = {s["uuid"]: s for s in samples}
    rows = session.execute(select(Gpu.id, Gpu.uuid, Gpu.parent_id).where(Gpu.node_id == node.id)).all()
    uuid_of = {gpu_id: uuid for gpu_id, uuid, _ in rows}
    sample_of: dict[int, dict[str, Any]] = {}
    for gpu_id, uuid, parent in rows:
        sample = by_uuid.get(uuid) or (by_uuid.get(uuid_of.get(parent, ""))
                                       if parent is not None else None)
        if sample is not None:
            sample_of[gpu_id] = sample
    for gpu_id, sample in sample_of.items():
        if uuid_of[gpu_id] in by_uuid:
            session.execute(update(Gpu).where(Gpu.id == gpu_id).values(
                util=sample["util"], mem_used_mb=sample["mem_used_mb"],
                temperature=sample["temperature"], power_mw=sample["power_mw"], sampled_at=now))
    held: dict[int, list[dict[str, Any]]] = {}
    for job_id, gpu_id in session.execute(select(Allocation.job_id, Allocation.gpu_id).where(
            Allocation.gpu_id.in_(list(sample_of)), Allocation.released_at.is_(None))):
        held.setdefault(job_id, []).append(sample_of[gpu_id])
    flagged = []
    # A suspended job (gcontrol suspend) is not idle: its samples are not its own use.
    for job in session.scalars(select(Job).where(Job.id.in_(list(held)), Job.state == "RUNNING",
                                                 Job.suspended_at.is_(None))):
        mine = held[job.id]
        util = sum(s["util"] for s in mine) / len(mine)
        job.util_samples += 1
        job.util_sum += util
        job.mem_sum_mb += sum(s["mem_used_mb"] for s in mine) / len(mine)
        job.util_peak = max(job.util_peak or 0, *(s["util"] for s in mine))
        job.mem_peak_mb = max(job.mem_peak_mb or 0, *(s["mem_used_mb"] for s in mine))
        if util > idle_percent:
            job.idle_since, job.idle = None, False
            continue
        job.idle_since = job.idle_since or now
        if not job.idle and (now - job.idle_since).total_seconds() >= idle_after:
            job.idle = True
            flagged.append(job.id)
    return flagged


def drain_gpu(session: Session, node_name: str, index: int, reason: Any) -> dict[str, Any]:
    """An administrator takes a GPU (with its slices) or a slice out of service. Running
    jobs keep it until they end. A drained GPU has no ``unhealthy_at``, so no clean
    period returns it: only ``resume_gpu`` does."""
    gpu = _gpu(session, node_name, index)
    affected = [gpu.id, *session.scalars(select(Gpu.id).where(Gpu.parent_id == gpu.id))]
    session.execute(update(Gpu).where(Gpu.id.in_(affected)).values(
        healthy=False, health_reason=f"drained: {_reason(reason)}", unhealthy_at=None))
    return {"node": node_name, "index": index, "uuid": gpu.uuid, "healthy": False}


def _gpu(session: Session, node_name: str, index: int) -> Gpu:
    gpu = session.scalars(select(Gpu).join(Node, Node.id == Gpu.node_id).where(
        Node.name == node_name, Gpu.index == index, Gpu.present)).first()
    if gpu is None:
        raise NotFound(f"node {node_name} has no GPU with index {index}")
    return gpu


def _reason(reason: Any) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise UsageError("reason: say why (Slurm's Reason=), e.g. \"bad fan\"")
    return reason.strip()[:MAX_REASON]


def set_node_state(session: Session, node_name: str, drain: bool, reason: Any = None
                   ) -> dict[str, Any]:
    """Drain a node (no new jobs; running ones go on) or return it to service."""
    node = session.scalars(select(Node).where(Node.name == node_name)).first()
    if node is None:
        raise NotFound(f"unknown node {node_name!r}")
    # An administrator's drain is theirs to lift, even over one the health check made.
    if drain:
        node.state, node.reason, node.drained_by = "DRAIN", _reason(reason), None
    elif node.state == "DRAIN":
        node.state, node.reason, node.drained_by = "UP", None, None
    return {"node": node.name, "state": node.state, "reason": node.reason}
