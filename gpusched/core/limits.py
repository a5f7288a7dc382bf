"""QOS limits and GPU-hour budgets during a pass: what running jobs hold, and whether
one more job fits."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping

from gpusched.core.budgets import BudgetBook, BudgetState
from gpusched.core.licenses import LicenseTracker
from gpusched.core.model import PendingJob, QosLimits, Reason, RunningJob


class LimitTracker:
    """Per-QOS holdings by user and by account, and the GPU-seconds committed against
    each budget (``budgets``, None: no budgets), updated as the pass starts jobs."""

    def __init__(self, limits: Mapping[str, QosLimits], running: Iterable[RunningJob],
                 budgets: BudgetBook | None = None,
                 licenses: Mapping[str, int] | None = None) -> None:
        self.limits = limits
        self.budgets = budgets
        # The licenses running jobs hold (None: the cluster declares none).
        self.licenses = LicenseTracker(licenses, running) if licenses else None
        # Accounts whose jobs a budget covers (the rest need no look at budgets).
        self.budgeted = budgets.accounts if budgets is not None else frozenset()
        self.user_gpus: Counter[tuple[str, str]] = Counter()
        self.user_jobs: Counter[tuple[str, str]] = Counter()
        self.account_gpus: Counter[tuple[str, str | None]] = Counter()
        for job in running:
            if job.qos is not None:
                self._add(job.qos, job.user, job.account, len(job.gpu_uuids))

    def _add(self, qos: str, user: str, account: str | None, gpus: int) -> None:
        self.user_gpus[(qos, user)] += gpus
        self.user_jobs[(qos, user)] += 1
        self.account_gpus[(qos, account)] += gpus

    def blocking(self, job: PendingJob) -> Reason | None:
        """The first limit that starting ``job`` now would break, if any."""
        return next(self.violations(job), None)

    def violations(self, job: PendingJob) -> Iterator[Reason]:
        """Every limit that starting ``job`` now would break: its QOS's, a budget, then
        its licenses (any it asks for that are not free, or that the cluster lacks)."""
        yield from self._qos_violations(job)
        if self.budgets is not None and job.account in self.budgeted and self.budgets.over(job):
            yield Reason.ASSOC_GRP_GRES_MINUTES
        if job.licenses and (self.licenses is None or not self.licenses.fits(job.licenses)):
            yield Reason.LICENSES

    def budget_states(self, job: PendingJob) -> list[BudgetState]:
        """The budgets covering ``job`` as committed now (empty without any)."""
        return [] if self.budgets is None else self.budgets.states(job)

    def _qos_violations(self, job: PendingJob) -> Iterator[Reason]:
        limits = self.limits.get(job.qos or "")
        if limits is None or job.qos is None:
            return
        key = (job.qos, job.user)
        if limits.max_jobs_per_user is not None and self.user_jobs[key] + 1 > limits.max_jobs_per_user:
            yield Reason.QOS_MAX_JOBS_PER_USER
        if limits.max_gpus_per_user is not None and self.user_gpus[key] + job.gpus > limits.max_gpus_per_user:
            yield Reason.QOS_MAX_GPUS_PER_USER
        if limits.grp_gpus is not None and self.account_gpus[(job.qos, job.account)] + job.gpus > limits.grp_gpus:
            yield Reason.QOS_GRP_GPUS

    def reserved(self, job: PendingJob) -> None:
        """Keep the licenses of a job given a reservation from the jobs after it in this
        pass: backfill then never takes what it needs when its GPUs come."""
        if self.licenses is not None and job.licenses:
            self.licenses.take(job.licenses)

    def started(self, job: PendingJob) -> None:
        """Count a job this pass starts."""
        if job.qos is not None:
            self._add(job.qos, job.user, job.account, job.gpus)
        if self.budgets is not None and job.account in self.budgeted:
            self.budgets.started(job)
        if self.licenses is not None:
            self.licenses.take(job.licenses)
