"""Fair-share usage: billed GPU-seconds of running jobs, accrued and decayed in the database."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from gpusched.core.fairshare import accrue
from gpusched.db.models import Allocation, FairShareUsage, Gpu, GpuBilling, Job


def billed_rates(session: Session) -> dict[tuple[str, str], float]:
    """GPUs each (user, account) holds now, weighted by their type's billing weight."""
    rates: dict[tuple[str, str], float] = defaultdict(float)
    weight = func.coalesce(GpuBilling.weight, 1.0)
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
