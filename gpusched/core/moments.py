"""What a pass saw when it came to one job (``Moment``), recorded for ``gpusched.core.explain``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from gpusched.core.budgets import BudgetState
from gpusched.core.capacity import Capacity
from gpusched.core.limits import LimitTracker
from gpusched.core.model import PendingJob, Reason
from gpusched.core.sharing import wants_share
from gpusched.core.units import Shape


@dataclass(frozen=True, slots=True)
class Moment:
    """What the pass saw when it came to one job: the raw material of an explanation."""

    job: PendingJob
    waits: tuple[Reason, ...]  # every reason that holds it back and blocks nobody, ranked
    blocked_by: PendingJob | None  # the job ahead that holds its partition, if any
    best_free: tuple[str, int] | None  # the candidate node with most free GPUs, and how many
    qos_held: tuple[int, int, int]  # the user's jobs and GPUs, the account's GPUs, in its QOS
    array_running: int  # tasks of its array running (or starting in this pass)
    # A node with room for it now, the reserved job it would delay there, and when that
    # reservation starts: why it was not backfilled.
    in_the_way: tuple[str, int, float] | None = None
    # A job asking for a share of one GPU: whether it has a place now, and the shared GPU
    # with most room for it (node, units free), if any.
    share_fits: bool = False
    share_room: tuple[str, int] | None = None
    # The GPU-hour budgets covering it, as committed when the pass reached it.
    budgets: tuple[BudgetState, ...] = ()


class MomentMixin:
    """``_record``, for SchedulingPass: the ``Moment`` of its watched job."""

    capacity: Capacity
    limits: LimitTracker
    blocked: dict[str, PendingJob]
    array_running: Counter[int]
    moment: Moment | None
    where: Callable[[PendingJob], tuple[frozenset[int], object]]
    waits: Callable[[PendingJob], Iterator[Reason]]
    _share_moment: Callable[[PendingJob, frozenset[int]], tuple[bool, tuple[str, int] | None]]

    def _record(self, job: PendingJob) -> None:
        members = self.where(job)[0]
        best = self.capacity.biggest_free(members, Shape.of(job))
        qos, user = job.qos or "", job.user
        moment = Moment(
            job, tuple(self.waits(job)), self.blocked.get(job.partition), best,
            (self.limits.user_jobs[(qos, user)], self.limits.user_gpus[(qos, user)],
             self.limits.account_gpus[(qos, job.account)]),
            self.array_running[job.array_job_id] if job.array_job_id is not None else 0,
            self.capacity.in_the_way(Shape.of(job), members),
            *(self._share_moment(job, members) if wants_share(job) else ()))
        self.moment = replace(moment, budgets=tuple(self.limits.budget_states(job)))
