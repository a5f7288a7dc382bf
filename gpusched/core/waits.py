"""The rules that hold a pending job back without blocking anyone (its partition's
limits, dependencies, holds, begin time, QOS limits, budgets, licenses, array limits,
constraints, deadline): the part of a scheduling pass (core/plan.py) that says why a
job waits before any node is looked at."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from gpusched.core.budgets import BudgetBook
from gpusched.core.dependency import waiting_reason
from gpusched.core.feature_starts import FeatureHooks
from gpusched.core.limits import LimitTracker
from gpusched.core.model import PartitionView, PendingJob, Reason, Snapshot
from gpusched.core.timecut import past_deadline


def partition_waits(job: PendingJob, part: PartitionView | None) -> Iterator[Reason]:
    """What ``part``'s own rules hold ``job`` back for (None: no such partition)."""
    if part is None or not part.up:
        yield Reason.PARTITION_DOWN
        if part is None:
            return
    if part.max_time is not None and (job.time_limit is None or job.time_limit > part.max_time):
        yield Reason.PARTITION_TIME_LIMIT
    if job.account is not None and (job.account in part.deny_accounts or (
            part.allow_accounts is not None and job.account not in part.allow_accounts)):
        yield Reason.ACCOUNT_NOT_ALLOWED
    if part.max_gpus_per_job is not None and job.gpus > part.max_gpus_per_job:
        yield Reason.PARTITION_CONFIG


def partition_open(part: PartitionView) -> bool:
    """Whether ``partition_waits`` holds no job back in ``part``, whatever the job."""
    return (part.up and part.max_time is None and part.allow_accounts is None
            and not part.deny_accounts and part.max_gpus_per_job is None)


class WaitRulesMixin:
    """``waits`` and its quick test ``_plain``, for SchedulingPass."""

    snapshot: Snapshot
    now: float
    partitions: dict[str, PartitionView]
    open_partitions: frozenset[str]
    features: FeatureHooks
    busy_names: set[tuple[str, str]]
    limits: LimitTracker
    limited_qos: frozenset[str]
    budgeted: frozenset[str]
    budgets: BudgetBook | None
    array_running: Counter[int]

    def _plain(self, job: PendingJob) -> bool:
        """Whether no rule of ``waits`` can apply to ``job``: most jobs, checked cheaply.
        Every rule added to ``waits`` needs its condition here too."""
        return ((job.partition in self.open_partitions or next(partition_waits(
                    job, self.partitions.get(job.partition)), None) is None)
                and not job.dependency and job.hold is None and job.begin_time is None
                and job.deadline is None and job.time_min is None  # core/timecut.py
                and (job.qos is None or job.qos not in self.limited_qos)
                and job.array_max_running is None and not job.licenses and not job.constraint
                and (self.budgets is None or job.account not in self.budgeted
                     or self.budgets.fits(job)))

    def waits(self, job: PendingJob) -> Iterator[Reason]:
        """Reasons that hold ``job`` back without blocking anyone, most fundamental first."""
        if job.deadline is not None and past_deadline(job, self.now):
            yield Reason.DEADLINE  # it can never run: applying the plan ends it
        if job.partition not in self.open_partitions:
            yield from partition_waits(job, self.partitions.get(job.partition))
        if job.constraint and not self.features.possible(job):
            yield Reason.BAD_CONSTRAINTS
        deps = (waiting_reason(job, self.snapshot, (job.user, job.name) in self.busy_names,
                               self.now) if job.dependency else None)
        if deps is Reason.DEPENDENCY_NEVER_SATISFIED:
            yield deps
        if job.hold == "admin":
            yield Reason.JOB_HELD_ADMIN
        elif job.hold is not None:
            yield Reason.JOB_HELD_USER
        if job.begin_time is not None and job.begin_time > self.now:
            yield Reason.BEGIN_TIME
        if deps is Reason.DEPENDENCY:
            yield deps
        if job.qos is not None or job.account in self.budgeted or job.licenses:
            yield from self.limits.violations(job)
        if (job.array_max_running is not None and job.array_job_id is not None
                and self.array_running[job.array_job_id] >= job.array_max_running):
            yield Reason.JOB_ARRAY_TASK_LIMIT
