"""Partitions as configured, mirrored into the database, and as the API lists them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from gpusched.config import PartitionConfig
from gpusched.db.models import Node, Partition


def seed_partitions(session: Session, configured: tuple[PartitionConfig, ...]) -> bool:
    """Store the configured partitions if the database has none yet; True if it did.

    Afterwards partitions are managed with ``gpusched admin apply`` (partitions.toml).
    """
    if session.scalar(select(Partition.name).limit(1)) is not None:
        return False
    sync_partitions(session, configured)
    return True


def sync_partitions(session: Session, configured: tuple[PartitionConfig, ...]) -> None:
    """Make the stored partitions match the configuration.

    Partitions that left the configuration become INACTIVE rather than being deleted,
    because ended jobs still refer to them.
    """
    default = next((p.name for p in configured if p.default), configured[0].name)
    for part in configured:
        values = {"nodes": list(part.nodes), "is_default": part.name == default,
                  "max_time": part.max_time, "default_time": part.default_time, "state": "UP"}
        session.execute(insert(Partition).values(name=part.name, **values)
                        .on_conflict_do_update(index_elements=[Partition.name], set_=values))
    session.execute(update(Partition).where(Partition.name.not_in([p.name for p in configured]))
                    .values(state="INACTIVE", is_default=False))


def partition_listing(session: Session) -> list[dict[str, Any]]:
    """Every partition with its nodes ("*" expanded to every node), limits and how it
    shares its GPUs (``sharing`` mps or shard, None: whole GPUs only; ``shares``: the
    units each GPU offers), by name (``GET /v1/partitions``)."""
    every = list(session.scalars(select(Node.name).order_by(Node.name)))
    return [{"name": p.name, "state": p.state, "default": p.is_default,
             "nodes": every if p.nodes == ["*"] else list(p.nodes),
             "max_time": p.max_time, "default_time": p.default_time,
             "priority_tier": p.priority_tier, "max_gpus_per_job": p.max_gpus_per_job,
             "requeue": p.requeue, "sharing": p.sharing, "shares": p.shares,
             "idle_warn_after": p.idle_warn_after, "idle_action": p.idle_action,
             "idle_action_after": p.idle_action_after}
            for p in session.scalars(select(Partition).order_by(Partition.name))]
