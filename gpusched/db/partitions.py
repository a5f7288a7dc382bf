"""Partitions as configured, mirrored into the database."""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from gpusched.config import PartitionConfig
from gpusched.db.models import Partition


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
