"""Job control, the pure parts (scontrol's job side): job references with array task
ids (``12``, ``12_3``), the queue order after ``gcontrol top``, and the time a
suspended job has not run.

A reference names a job row or one task of an array: ``12_3`` is task 3 of array 12,
whether task 3 still waits in the array's pending record or runs in a row of its own.
The CLIs and the API take references through ``parse_job_ref`` only.

``gcontrol top`` (scontrol top) moves jobs ahead of the other pending jobs of the same
user, partition, account and QOS. Like Slurm, it takes nothing from other users: the
group's jobs swap places among the queue positions the group already held, so every
other job keeps its place.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, TypeVar

from gpusched.core.arrays import MAX_TASK_ID, runs
from gpusched.core.bounds import parse_job_ref as bounds_job_ref

T = TypeVar("T")
MAX_TOP_JOBS = 1000  # jobs one ``gcontrol top`` may name


class JobRefError(ValueError):
    """A job reference is malformed; the message names it."""


@dataclass(frozen=True, slots=True)
class JobRef:
    """A job (``task`` None) or one task of array ``job_id``."""

    job_id: int
    task: int | None = None

    def text(self) -> str:
        """``12`` or ``12_3``, as squeue shows it."""
        return str(self.job_id) if self.task is None else f"{self.job_id}_{self.task}"


def parse_job_ref(text: str) -> JobRef:
    """``12`` or ``12_3`` (an array task); anything else is a JobRefError naming it
    (gpusched.core.bounds.parse_job_ref reads it)."""
    found = bounds_job_ref(text)
    if found is None:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise JobRefError(f"invalid job id {shown!r}: expected a job id such as 12, or an "
                          f"array task such as 12_3 (task ids 0 to {MAX_TASK_ID})")
    return JobRef(*found)


def parse_job_refs(texts: Sequence[str], limit: int = 10_000) -> list[JobRef]:
    """Several references (each item may hold a comma-separated list), duplicates
    dropped in order; at most ``limit``."""
    found: dict[JobRef, None] = {}
    for text in texts:
        for item in text.split(","):
            if item.strip():
                found[parse_job_ref(item)] = None
                if len(found) > limit:
                    raise JobRefError(f"more than {limit} job ids")
    if not found:
        raise JobRefError("expected at least one job id")
    return list(found)


def ref_matches(refs: Sequence[JobRef], job_id: int, array_job_id: int | None,
                array_task_id: int | None) -> bool:
    """Whether a job row (its id, its array's and its task's) is one ``refs`` name: a
    job id names the job and, for an array, every task of it; ``12_3`` only task 3."""
    for ref in refs:
        if ref.task is None and ref.job_id in (job_id, array_job_id):
            return True
        if ref.task is not None and (array_job_id, array_task_id) == (ref.job_id, ref.task):
            return True
    return False


def task_in(tasks: str | None, task: int) -> bool:
    """Whether an array's pending task text (canonical, gpusched.core.arrays) holds
    ``task``, without listing its tasks."""
    if not tasks:
        return False
    return any(r.first <= task <= r.last and (task - r.first) % r.step == 0
               for r in runs(tasks))


def top_first(order: Sequence[T], group: Callable[[T], Hashable],
              rank: Callable[[T], int | None]) -> list[T]:
    """The queue ``order`` with each group's topped jobs (``rank`` not None) moved
    ahead of the group's other jobs, the most recently topped (highest rank) first,
    into the positions the group's jobs already hold; jobs of groups with no topped job
    and every position held by another group stay as they are."""
    topped_groups = {group(item) for item in order if rank(item) is not None}
    if not topped_groups:
        return list(order)
    slots: dict[Hashable, list[int]] = {}
    members: dict[Hashable, list[T]] = {}
    for at, item in enumerate(order):
        key = group(item)
        if key in topped_groups:
            slots.setdefault(key, []).append(at)
            members.setdefault(key, []).append(item)
    result = list(order)
    for key, items in members.items():
        topped = sorted((item for item in items if rank(item) is not None),
                        key=lambda item: -(rank(item) or 0))  # stable: ties keep order
        rest = [item for item in items if rank(item) is None]
        for at, item in zip(slots[key], topped + rest):
            result[at] = item
    return result


def _top_group(job: Any) -> Hashable:
    return (job.uid, job.partition, job.account, job.qos)


def moved_to_top(jobs: list[T]) -> list[T]:
    """Pending jobs (gpusched.core.model.PendingJob) in queue order, with the jobs moved
    by ``gcontrol top`` ahead of their owner's others of the same partition, account and
    QOS (see ``top_first``)."""
    if all(job.top is None for job in jobs):  # type: ignore[attr-defined]
        return jobs
    return top_first(jobs, _top_group, attrgetter("top"))


def suspended_seconds(total: float, suspended_at: float | None, now: float) -> float:
    """The seconds a job has spent suspended in its run: what it banked from earlier
    suspensions and, while suspended, the time since."""
    return total + (max(0.0, now - suspended_at) if suspended_at is not None else 0.0)


def effective_limit(time_limit: int | None, suspended: float) -> int | None:
    """The time limit counted from the run's start, with the time suspended added
    (a suspended job's clock stops); None without a limit."""
    return None if time_limit is None else time_limit + int(round(suspended))
