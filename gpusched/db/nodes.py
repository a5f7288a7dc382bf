"""Nodes and their GPUs as the API lists them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpusched.db.models import Allocation, Gpu, Node, NodeFeatures
from gpusched.db.reservations import node_reservations
from gpusched.errors import NotFound


def unregistered(name: str) -> NotFound:
    """The error for a node an agent names but never registered."""
    return NotFound(f"unknown node {name!r}: the agent must register first")


def node_named(session: Session, name: str) -> Node:
    """The node called ``name`` (it must exist)."""
    return session.scalars(select(Node).where(Node.name == name)).one()


def node_listing(session: Session) -> list[dict[str, Any]]:
    """Every node with its present GPUs (MIG slices naming their parent's index), a job
    holding each and the units of it shares hold (``share_units``), by node name
    (``GET /v1/nodes``)."""
    holders: dict[int, int] = {}
    shared: dict[int, int] = {}
    for gpu_id, job_id, units in session.execute(
            select(Allocation.gpu_id, Allocation.job_id, Allocation.units)
            .where(Allocation.released_at.is_(None))):
        holders[gpu_id] = job_id
        if units is not None:
            shared[gpu_id] = shared.get(gpu_id, 0) + units
    gpus: dict[int, list[dict[str, Any]]] = {}
    rows = list(session.scalars(select(Gpu).where(Gpu.present).order_by(Gpu.index)))
    index_of = {g.id: g.index for g in rows}
    for g in rows:
        gpus.setdefault(g.node_id, []).append({
            "parent": index_of.get(g.parent_id) if g.parent_id is not None else None,
            "index": g.index, "uuid": g.uuid, "name": g.name, "memory_mb": g.memory_mb,
            "type": g.gpu_type, "mig_profile": g.mig_profile,
            "healthy": g.healthy, "health_reason": g.health_reason,
            "unhealthy_at": g.unhealthy_at.isoformat() if g.unhealthy_at else None,
            "util": g.util, "mem_used_mb": g.mem_used_mb, "temperature": g.temperature,
            "power_mw": g.power_mw,
            "job_id": holders.get(g.id), "share_units": shared.get(g.id, 0)})
    admin = {f.node: f.features for f in session.scalars(select(NodeFeatures))}
    reserved = node_reservations(session)  # the advance reservation holding it now
    return [{"name": n.name, "state": n.state, "reason": n.reason, "run_uid": n.run_uid,
             "drained_by": n.drained_by, "enforced": n.enforced, "enforcement": n.enforcement,
             "container_runtime": n.container_runtime,
             "cpus": n.cpus, "memory_mb": n.memory_mb,  # as its agent reports them; 0: not
             "last_seen": n.last_seen.isoformat() if n.last_seen else None,
             # Its GPUs' and its admin's (-C/--constraint, docs/user-guide.md).
             "features": sorted({*n.features, *admin.get(n.name, ())}),
             "reservation": reserved.get(n.name),
             "gpus": gpus.get(n.id, [])}
            for n in session.scalars(select(Node).order_by(Node.name))]
