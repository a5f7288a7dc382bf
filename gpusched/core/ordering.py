"""The order a pass takes pending jobs in: by multifactor priority, or in submit order
when every priority is 0."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import itemgetter

from gpusched.core.fairshare import FairShareTree
from gpusched.core.jobcontrol import moved_to_top
from gpusched.core.model import PendingJob, Policy, Snapshot
from gpusched.core.priority import PriorityBreakdown, PriorityScale, scored_fields

# Sort keys of a PriorityBreakdown by field (an item getter is faster than a lambda).
_JOB_ID = itemgetter(PriorityBreakdown._fields.index("job_id"))
_TOTAL = itemgetter(PriorityBreakdown._fields.index("total"))


def fairshare_factors(snapshot: Snapshot, policy: Policy) -> dict[tuple[str, str], float]:
    """Each user association's fair-share factor (empty when no tree is configured)."""
    if not snapshot.user_shares or policy.weights.fairshare == 0:
        return {}
    tree = FairShareTree(snapshot.accounts, snapshot.user_shares)
    if policy.fairshare == "classic":
        return tree.classic(snapshot.usage)
    return tree.fair_tree(snapshot.usage)


def job_priorities(snapshot: Snapshot, now: float, policy: Policy) -> list[PriorityBreakdown]:
    """Every pending job's priority factors, highest first (ties: lower job id first)."""
    ranked = _breakdowns(snapshot, now, policy)
    # Stable sorts: by job id, then by total, highest first (``reverse`` keeps equal
    # totals in job id order).
    ranked.sort(key=_JOB_ID)
    ranked.sort(key=_TOTAL, reverse=True)
    return ranked


def _breakdowns(snapshot: Snapshot, now: float, policy: Policy) -> list[PriorityBreakdown]:
    """Each pending job's priority factors and total, in ``snapshot.pending``'s order."""
    factors = fairshare_factors(snapshot, policy)
    tiers = {p.name: p.tier for p in snapshot.partitions}
    scale = PriorityScale(
        cluster_gpus=sum(len(n.gpus) for n in snapshot.nodes),
        max_partition_tier=max(tiers.values(), default=0),
        max_qos_priority=max(snapshot.qos_priority.values(), default=0),
    )
    qos_priority = snapshot.qos_priority
    inputs = (  # the fields of a PriorityInput
        (job.job_id, job.eligible_time, job.gpus,
         # Jobs charging no account (none configured) are all treated alike.
         factors.get((job.user, job.account), 1.0) if job.account else 1.0,
         tiers.get(job.partition, 0), qos_priority.get(job.qos or "", 0))
        for job in snapshot.pending
    )
    scored = scored_fields(inputs, now, policy.weights, scale)
    w = policy.weights
    # --nice, taken off the weighted sum as Slurm takes it off its own (before the sum is
    # divided by the weights' sum here): positive lowers the job, negative raises it.
    point = 1.0 / max(1.0, w.age + w.fairshare + w.job_size + w.partition + w.qos)
    for i, job in enumerate(snapshot.pending):
        if job.priority is None and not job.nice and job.hold is None:
            continue
        b = scored[i]
        # A held job's priority is 0, as Slurm shows it; its factors stay for the
        # listing. Otherwise an administrator's number replaces the weighted total.
        scored[i] = b._replace(total=0.0 if job.hold is not None
                               else job.priority if job.priority is not None
                               else b.total - job.nice * point)
    return scored


def queue_order(snapshot: Snapshot, now: float, policy: Policy) -> list[PendingJob]:
    """Pending jobs by multifactor priority; equal priorities in submit order."""
    w = policy.weights
    pending = snapshot.pending
    if not (w.age or w.fairshare or w.job_size or w.partition or w.qos) and all(
            job.priority is None and not job.nice for job in pending):
        # Every priority is 0: submit order, without working each one out.
        return moved_to_top(sorted(pending, key=lambda job: (job.submit_time, job.job_id)))
    return _by_total(pending, [b.total for b in _breakdowns(snapshot, now, policy)])


def ordered(snapshot: Snapshot, ranked: Iterable[PriorityBreakdown]) -> list[PendingJob]:
    """The snapshot's pending jobs in the order of their computed priorities (``ranked``
    gives every one's total), as ``queue_order`` takes them."""
    total = {b.job_id: b.total for b in ranked}
    return _by_total(snapshot.pending, [total[job.job_id] for job in snapshot.pending])


def _by_total(pending: Sequence[PendingJob], totals: Sequence[float]) -> list[PendingJob]:
    """``pending`` (``totals[i]`` the priority of ``pending[i]``) in queue order: highest
    total first, then earliest submitted, then lowest job id; then ``gcontrol top``."""
    keys = sorted([(-total, job.submit_time, job.job_id, i)
                   for i, (total, job) in enumerate(zip(totals, pending))])
    return moved_to_top([pending[k[3]] for k in keys])
