"""Fair-share usage: billed GPU-seconds of running jobs, accrued and decayed in the
database; and what one allocation counts for in GPU-hours (``gpu_fraction``)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import Float, any_, case, cast, func, literal, or_, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, aliased

from gpusched.core.fairshare import accrue
from gpusched.db.models import (
    Allocation,
    FairShareUsage,
    Gpu,
    GpuBilling,
    Job,
    Node,
    Partition,
)


def offered_units() -> Any:
    """The units the GPU of an allocation row offers (SQL; NULL: unknown): those of the
    first partition by name that shares the GPUs of the allocation's node, as a pass
    reads them (an admin apply refuses a node shared two ways), else those of the job's
    own partition. Needs ``allocations`` and ``jobs`` in the query."""
    node = aliased(Node)
    by_node = (select(Partition.shares).join(node, node.id == Allocation.node_id)
               .where(Partition.sharing.is_not(None), Partition.shares > 0,
                      or_(node.name == any_(Partition.nodes),
                          literal("*") == any_(Partition.nodes)))
               .order_by(Partition.name).limit(1).scalar_subquery())
    by_job = (select(Partition.shares).where(Partition.name == Job.partition,
                                             Partition.shares > 0).scalar_subquery())
    return func.coalesce(by_node, by_job)


def gpu_fraction(offered: Any) -> Any:
    """How much of a GPU an allocation row counts for (SQL): 1 for a whole GPU or a MIG
    slice, ``units / offered`` for a share (at most 1; 1 when what the GPU offers is no
    longer known, the partition having stopped sharing it)."""
    share = func.least(1.0, cast(Allocation.units, Float) / func.nullif(offered, 0))
    return case((Allocation.units.is_(None), literal(1.0)), else_=func.coalesce(share, 1.0))


def billed_rates(session: Session) -> dict[tuple[str, str], float]:
    """GPUs each (user, account) holds now, weighted by their type's billing weight; a
    share counts as its fraction of the GPU."""
    rates: dict[tuple[str, str], float] = defaultdict(float)
    weight = func.coalesce(GpuBilling.weight, 1.0) * gpu_fraction(offered_units())
    rows = session.execute(
        select(Job.user_name, Job.account, func.sum(weight))
        .join(Allocation, Allocation.job_id == Job.id)
        .join(Gpu, Gpu.id == Allocation.gpu_id)
        .outerjoin(GpuBilling, GpuBilling.gpu_type == Gpu.gpu_type)
        .where(Allocation.released_at.is_(None), Job.account.is_not(None))
        .group_by(Job.user_name, Job.account)
    )
    for user, account, rate in rows:
        if account is not None:
            rates[(user, account)] += float(rate)
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
