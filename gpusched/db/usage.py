"""Fair-share usage: billed GPU-seconds of running jobs, accrued and decayed in the
database; and the units the GPU of a share offers (``ShareOffers``)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from gpusched.core.fairshare import accrue
from gpusched.core.usage import gpu_fraction
from gpusched.db.admincache import EVERY_NODE
from gpusched.db.models import (
    Allocation,
    FairShareUsage,
    Gpu,
    GpuBilling,
    Job,
    Node,
    Partition,
)


class ShareOffers:
    """The units the GPUs of a share offer, read once: those of the first partition by
    name that shares the GPUs of the share's node, as a pass reads them (an admin apply
    refuses a node shared two ways), else those of the job's own partition (None:
    unknown, the partition no longer sharing them)."""

    def __init__(self, session: Session) -> None:
        every: list[str] | None = None
        self.by_node: dict[str, int] = {}
        self.by_partition: dict[str, int] = {}
        for name, members, shares in session.execute(
                select(Partition.name, Partition.nodes, Partition.shares)
                .where(Partition.sharing.is_not(None), Partition.shares > 0)
                .order_by(Partition.name)):
            if shares is None:  # not sharing (the query leaves those out)
                continue
            self.by_partition[name] = shares
            if EVERY_NODE in members and every is None:
                every = list(session.scalars(select(Node.name)))
            for node in (every or []) if EVERY_NODE in members else members:
                self.by_node.setdefault(node, shares)

    def of(self, units: int | None, node: str, partition: str) -> int | None:
        """The units the GPU a holding of ``units`` on ``node`` by a job of
        ``partition`` offers (None for a whole GPU or a slice, ``units`` None)."""
        if units is None:
            return None
        return self.by_node.get(node) or self.by_partition.get(partition)


def billed_rates(session: Session) -> dict[tuple[str, str], float]:
    """GPUs each (user, account) holds now, weighted by their type's billing weight; a
    share counts as its fraction of the GPU (``core.usage.gpu_fraction``)."""
    rates: dict[tuple[str, str], float] = defaultdict(float)
    offers = ShareOffers(session)
    rows = session.execute(
        select(Job.user_name, Job.account, Job.partition, func.coalesce(GpuBilling.weight, 1.0),
               Allocation.units, Node.name)
        .join(Allocation, Allocation.job_id == Job.id)
        .join(Gpu, Gpu.id == Allocation.gpu_id)
        .join(Node, Node.id == Allocation.node_id)
        .outerjoin(GpuBilling, GpuBilling.gpu_type == Gpu.gpu_type)
        .where(Allocation.released_at.is_(None), Job.account.is_not(None))
    )
    for user, account, partition, weight, units, node in rows:
        offered = offers.of(units, node, partition)
        if account is not None:  # the query leaves jobs without one out
            rates[(user, account)] += float(weight) * gpu_fraction(units, offered)
    return dict(rates)


def accrue_usage(session: Session, now: datetime, half_life: float) -> int:
    """Decay every stored usage to ``now`` and add what running jobs billed since; rows touched.

    The GPUs held now are taken to have been held since the previous accrual, so a job
    that starts or ends between two accruals is billed to within one interval.
    """
    rates = billed_rates(session)
    stored = {(u, a): (value, at) for u, a, value, at in session.execute(
        select(FairShareUsage.user_name, FairShareUsage.account, FairShareUsage.usage,
               FairShareUsage.updated_at).with_for_update())}
    for key in stored.keys() | rates.keys():
        value, since = stored.get(key, (0.0, now))
        elapsed = max((now - since).total_seconds(), 0.0)
        new = accrue(value, elapsed, half_life, rates.get(key, 0.0))
        values = {"usage": new, "updated_at": now}
        session.execute(insert(FairShareUsage).values(user_name=key[0], account=key[1], **values)
                        .on_conflict_do_update(index_elements=["user_name", "account"], set_=values))
    return len(stored.keys() | rates.keys())
