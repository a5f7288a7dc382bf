"""A pending job's time limit cut down to start it: sbatch's --time-min and --deadline
(pure).

A job with ``time_min`` may start with its time limit lowered, to no less than
``time_min``, when that lets it start now: a shorter run ends before the reservation of
a job ahead of it that it would otherwise delay, as Slurm's backfill does. The limit
chosen is the longest that fits, in whole minutes (Slurm's unit), and becomes the job's
time limit. A job with a ``deadline`` starts only with a limit that ends by then (cut
down to the deadline where ``time_min`` allows); once not even its least limit could
end by the deadline, it can never run, and the pass ends it (state DEADLINE).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from gpusched.core.model import PendingJob
from gpusched.core.units import INF, Shape

MINUTE = 60
P = TypeVar("P")


def least_limit(job: PendingJob) -> float:
    """The shortest time limit ``job`` may run with (INF: no limit at all)."""
    least = job.time_min if job.time_min is not None else job.time_limit
    return INF if least is None else float(least)


def past_deadline(job: PendingJob, now: float) -> bool:
    """Whether no run of ``job`` started now or later could end by its deadline."""
    return job.deadline is not None and now + least_limit(job) > job.deadline


def capped(job: PendingJob, now: float) -> PendingJob:
    """``job`` with its time limit cut to end by its deadline (only a job with a
    ``time_min`` may need it: one without starts only when its whole limit fits)."""
    if job.deadline is None or job.time_min is None:
        return job
    room = int(job.deadline - now) // MINUTE * MINUTE
    if job.time_limit is not None and job.time_limit <= room:
        return job
    return replace(job, time_limit=max(room, job.time_min))


def cut_start(job: PendingJob, place: Callable[[Shape], P | None]) -> tuple[P, Shape] | None:
    """The longest limit from ``job.time_min`` up to (not including) its time limit, in
    whole minutes, with which ``place`` finds room for ``job`` now, and that room; None
    when even ``time_min`` finds none. ``place`` is tried with shorter runs only: a
    shorter run fits wherever a longer one does, so the search halves the range."""
    if job.time_min is None or job.time_limit is None or job.time_min >= job.time_limit:
        return None
    shape = Shape.of(job)
    found = place(shape._replace(duration=float(job.time_min)))
    if found is None:
        return None
    best = (found, shape._replace(duration=float(job.time_min)))
    low = job.time_min // MINUTE  # minutes known to fit (as time_min did, or less)
    high = (job.time_limit - 1) // MINUTE  # whole minutes below the limit
    while low < high:
        middle = (low + high + 1) // 2
        trial = shape._replace(duration=float(middle * MINUTE))
        found = place(trial)
        if found is None:
            high = middle - 1
        else:
            low, best = middle, (found, trial)
    return best
