"""Agent-facing operations: registration, heartbeats, work to claim, launch and end reports."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import case, delete, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from gpusched.core.topology import LINK_KINDS
from gpusched.db.engine import rowcount
from gpusched.db.health import may_requeue
from gpusched.db.jobs import job_placements
from gpusched.db.models import Allocation, Gpu, GpuLink, Job, JobScript, Node
from gpusched.errors import NotFound, UsageError
from gpusched.messages import JobEnd, LaunchOrder

# The state each outcome of gpusched.messages.OUTCOMES ends a job in.
OUTCOME_STATES = {
    "completed": "COMPLETED",
    "failed": "FAILED",
    "launch_failed": "FAILED",
    "cancelled": "CANCELLED",
    "timeout": "TIMEOUT",
}


LAUNCH_FAILED_REASON = "LaunchFailed"


def _node(session: Session, name: str) -> Node:
    node = session.scalars(select(Node).where(Node.name == name)).first()
    if node is None:
        raise NotFound(f"unknown node {name!r}: the agent must register first")
    return node


def register_node(session: Session, body: dict[str, Any]) -> Node:
    """Create or refresh a node and its GPU inventory; the node becomes UP."""
    name, gpus, uid = body.get("node"), body.get("gpus"), body.get("uid")
    if not isinstance(name, str) or not name:
        raise UsageError("node: expected the node name")
    if not isinstance(gpus, list) or not isinstance(uid, int):
        raise UsageError("gpus: expected a list of GPUs; uid: expected the agent's uid")
    now = datetime.now(UTC)
    cpus, memory_mb, block = body.get("cpus", 0), body.get("memory_mb", 0), body.get("block")
    if not isinstance(cpus, int) or not isinstance(memory_mb, int) or cpus < 0 or memory_mb < 0:
        raise UsageError("cpus, memory_mb: expected whole numbers, 0 or more")
    if block is not None and not isinstance(block, str):
        raise UsageError("block: expected a topology block name")
    values: dict[str, Any] = {"state": "UP", "reason": None, "run_uid": None if uid == 0 else uid,
                              "registered_at": now, "last_seen": now, "cpus": cpus,
                              "memory_mb": memory_mb, "block": block}
    stmt = insert(Node).values(name=name, **values)
    # A drained node stays drained, whatever its agent does, until an admin resumes it.
    kept = {**values, "state": case((Node.state == "DRAIN", "DRAIN"), else_="UP"),
            "reason": case((Node.state == "DRAIN", Node.reason), else_=None)}
    session.execute(stmt.on_conflict_do_update(index_elements=[Node.name], set_=kept))
    node = _node(session, name)
    seen: list[str] = []
    for gpu in gpus:
        if not isinstance(gpu, dict) or not isinstance(gpu.get("uuid"), str):
            raise UsageError("gpus: each GPU needs at least a uuid")
        row = {
            "node_id": node.id, "index": int(gpu.get("index", 0)), "uuid": gpu["uuid"],
            "name": str(gpu.get("name", "")), "memory_mb": int(gpu.get("memory_mb", 0)),
            "pci_bus_id": str(gpu.get("pci_bus_id", "")), "present": True,
            "gpu_type": str(gpu.get("type") or "gpu"),
            "mig_profile": gpu.get("mig_profile") or None,
        }
        session.execute(insert(Gpu).values(**row).on_conflict_do_update(
            index_elements=[Gpu.uuid], set_=row))
        seen.append(gpu["uuid"])
    _register_slices_and_links(session, node, gpus, body.get("links") or [])
    # A GPU that vanished keeps its row (allocations refer to it) but is no longer offered.
    session.execute(update(Gpu).where(Gpu.node_id == node.id, Gpu.uuid.not_in(seen))
                    .values(present=False))
    return node


def _register_slices_and_links(session: Session, node: Node, gpus: list[dict[str, Any]],
                               links: list[Any]) -> None:
    """MIG slices point at their parent GPU; the node's GPU links are replaced."""
    ids = dict(session.execute(select(Gpu.index, Gpu.id).where(
        Gpu.node_id == node.id, Gpu.uuid.in_([g["uuid"] for g in gpus]))).all())
    for gpu in gpus:
        parent = gpu.get("parent")
        if parent is not None and parent not in ids:
            raise UsageError(f"gpus: MIG slice {gpu['uuid']} names parent GPU {parent}, "
                             f"which this node does not have")
        session.execute(update(Gpu).where(Gpu.uuid == gpu["uuid"])
                        .values(parent_id=ids.get(parent) if parent is not None else None))
    session.execute(delete(GpuLink).where(GpuLink.gpu_a.in_(list(ids.values()))))
    rows = []
    for link in links:
        if not isinstance(link, dict) or link.get("a") not in ids or link.get("b") not in ids \
                or link.get("kind") not in LINK_KINDS or link["a"] == link["b"]:
            raise UsageError("links: expected {a, b, kind, nvlinks} between GPUs of this node")
        a, b = sorted((ids[link["a"]], ids[link["b"]]))
        rows.append({"gpu_a": a, "gpu_b": b, "kind": link["kind"],
                     "nvlinks": int(link.get("nvlinks") or 0)})
    if rows:
        session.execute(insert(GpuLink).values(rows).on_conflict_do_nothing())


def heartbeat(session: Session, name: str) -> tuple[Node, bool]:
    """Record that the node's agent is alive; a DOWN node comes back UP (then True)."""
    node = _node(session, name)
    node.last_seen = datetime.now(UTC)
    came_back = node.state == "DOWN"
    if came_back:
        node.state, node.reason = "UP", None
    return node, came_back


def pending_work(session: Session, node: Node, signalled: set[int]) -> dict[str, Any]:
    """Launches not yet acknowledged and cancels not yet acted on for ``node``."""
    jobs = list(session.scalars(
        select(Job).where(Job.state == "RUNNING", Job.node_id == node.id).order_by(Job.id)
    ))
    to_launch = [j for j in jobs if j.launched_at is None and j.cancel_requested_at is None]
    cancels = [j.id for j in jobs if j.cancel_requested_at is not None and j.id not in signalled]
    placed = job_placements(session, [(j.id, j.node_id) for j in to_launch])
    payloads = {p.id: p for p in session.scalars(select(JobScript).where(
        JobScript.id.in_({j.script_id for j in to_launch})))} if to_launch else {}
    launches = [
        LaunchOrder(
            job_id=j.id, run=j.restarts, node=node.name, name=j.name, user=j.user_name,
            uid=j.uid, gid=j.gid, script=payloads[j.script_id].script,
            args=tuple(payloads[j.script_id].args), work_dir=j.work_dir,
            environment=dict(payloads[j.script_id].environment), output=j.output,
            error=j.error, umask=j.umask, time_limit=j.time_limit,
            warn_signal=j.warn_signal, warn_seconds=j.warn_seconds,
            warn_batch_only=bool(j.warn_batch_only),
            gpu_uuids=tuple(placed.get(j.id, (node.name, []))[1]),
            node_names=tuple(j.node_names or ()), array_job_id=j.array_job_id,
            array_task_id=j.array_task_id, array_spec=j.array_spec,
        ).to_json()
        for j in to_launch
    ]
    # Time limits changed after launch: the agent applies each seq it has not seen.
    limits = [{"job_id": j.id, "time_limit": j.time_limit, "seq": j.limit_seq}
              for j in jobs if j.limit_seq and j.launched_at is not None
              and j.cancel_requested_at is None]
    signals = [{"job_id": j.id, "signal": j.signal_pending, "seq": j.signal_seq}
               for j in jobs if j.signal_pending is not None and j.cancel_requested_at is None
               and j.launched_at is not None]
    return {"launches": launches, "cancels": cancels, "signals": signals, "limits": limits}


def signal_delivered(session: Session, job_id: int, body: dict[str, Any]) -> bool:
    """The agent sent the job its pending signal (``seq`` as it was told); False if a
    newer request came meanwhile, which the next poll carries."""
    seq = body.get("seq")
    if not isinstance(seq, int):
        raise UsageError("seq: expected the signal request's number")
    node = _node(session, str(body.get("node")))
    return bool(rowcount(session.execute(
        update(Job).where(Job.id == job_id, Job.node_id == node.id, Job.signal_seq == seq)
        .values(signal_pending=None))))


def mark_launched(session: Session, job_id: int, node_name: str) -> bool:
    """Record that the job's supervisor runs; False if it was already recorded."""
    node = _node(session, node_name)
    return bool(rowcount(session.execute(
        update(Job).where(Job.id == job_id, Job.node_id == node.id, Job.state == "RUNNING",
                          Job.launched_at.is_(None))
        .values(launched_at=datetime.now(UTC))
    )))


def record_end(session: Session, job_id: int, body: dict[str, Any]) -> bool:
    """Record how a job ended and release its GPUs; False if already recorded.

    ``body`` is a JobEnd report (gpusched.messages), refused whole when any field is
    out of its bounds."""
    end = JobEnd.parse(body)
    node = _node(session, end.node)
    ended = (datetime.fromtimestamp(end.end_time, UTC) if end.end_time is not None
             else datetime.now(UTC))
    job = session.get(Job, job_id)
    failure = job.gpu_failure if job is not None else None
    if job is not None and failure is not None and may_requeue(session, job):
        # Its GPU failed: back in the queue with its submit time, one restart more.
        values: dict[str, Any] = {
            "state": "PENDING", "reason": "None", "node_id": None, "start_time": None,
            "launched_at": None, "cancel_requested_at": None, "gpu_failure": None,
            "error_message": f"requeued: {failure}", "node_names": None, "start_kind": None,
            "restarts": Job.restarts + 1}
    elif failure is not None:
        values = {"state": "FAILED", "end_time": ended, "exit_code": end.exit_code,
                  "signal": end.signal, "error_message": failure}
    elif job is not None and job.preempted_at is not None and job.preempt_mode == "requeue":
        # Preempted to requeue: back in the queue with its submit time, one restart more.
        values = {
            "state": "PENDING", "reason": "None", "node_id": None, "start_time": None,
            "launched_at": None, "cancel_requested_at": None, "preempted_at": None,
            "preempt_mode": None, "node_names": None, "start_kind": None,
            "restarts": Job.restarts + 1}
    else:
        values = {"state": OUTCOME_STATES[end.outcome], "end_time": ended,
                  "exit_code": end.exit_code, "signal": end.signal,
                  "error_message": end.error}
        if end.outcome == "launch_failed":  # nothing of it ran: say so where users look
            values["reason"] = LAUNCH_FAILED_REASON
        if job is not None and job.preempted_at is not None:
            values.update(state="CANCELLED",
                          error_message=f"preempted by job {job.preempted_by}")
    changed = rowcount(session.execute(
        update(Job).where(Job.id == job_id, Job.node_id == node.id, Job.state == "RUNNING")
        .values(**values)
    ))
    if changed:
        session.execute(update(Allocation).where(Allocation.job_id == job_id,
                                                 Allocation.released_at.is_(None))
                        .values(released_at=datetime.now(UTC)))
    return bool(changed)


def mark_stale_nodes_down(session: Session, timeout: float) -> list[str]:
    """Nodes whose agent has been silent for ``timeout`` seconds go DOWN."""
    cutoff = datetime.now(UTC) - timedelta(seconds=timeout)
    return list(session.scalars(
        update(Node).where(Node.state == "UP", Node.last_seen < cutoff)
        .values(state="DOWN", reason="Not responding").returning(Node.name)
    ))
