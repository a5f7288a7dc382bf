"""Partitions as configured, mirrored into the database."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from gpusched.config import PartitionConfig
from gpusched.db.models import Partition


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
