"""A deliberately simple reference scheduler: FCFS, EASY and conservative backfill over a
pool of interchangeable GPUs, as an event-driven simulation.

It is written from the textbook definitions (Lifka's EASY as Mu'alem and Feitelson
describe it, 2001; conservative backfill from the same paper) and shares nothing with
``gpusched.core``: no caches, no node model, no incremental passes. Its only job is to be
obviously right, so that the real scheduler can be held to it.

Jobs and time
    A job is (id, submit time, GPUs, time limit, run time). Limits are finite and at
    least 1 second; the run time is at most the limit (so a job is never killed, and
    every reservation made from limits is sound). A job asking for more GPUs than the
    pool has is refused with ``ValueError``.

Queue order
    Submit time, then job id.

Events and tie-breaks
    The clock jumps from one event time to the next. At each time ``t``: every running
    job whose end (start + run time) is ``t`` ends first, then every job submitted at
    ``t`` joins the queue, then the policy is applied once. A job started at ``t`` with a
    run time of 0 ends at ``t``: that is a new event at the same time, so its GPUs come
    back and the policy is applied again at ``t``. Nothing else can change what a policy
    decides, so it is applied only at event times.

What a running job holds, as far as plans go
    Its GPUs until start + time limit (never its real end, which a scheduler cannot
    know). A job that ends earlier gives its GPUs back at its real end, an event.

Policies (applied at ``now`` with ``free`` GPUs)
    fcfs
        Start jobs in queue order while the first one fits; stop at the first that does
        not.
    easy
        Start jobs in queue order while they fit. The first that does not is the head.
        Its shadow time is the earliest time, counting running jobs (including those
        started in this application) as ending at start + limit, at which at least its
        GPUs are free; extra = GPUs free at the shadow time - the head's GPUs. Each later
        job, in queue order, starts now if it fits now and either ends by the shadow
        time (now + limit <= shadow) or needs no more GPUs than the extra; in the second
        case (only) it uses up that much of the extra. The shadow time and the extra are
        worked out once, before any job is backfilled.
    conservative
        The free GPUs over time form a profile (running jobs end at start + limit). Each
        job, in queue order, gets a reservation at the earliest time ``s >= now`` at which
        at least its GPUs are free throughout ``[s, s + limit)``; the reservation is taken
        out of the profile before the next job is looked at. Jobs whose reservation is
        ``now`` start now. All reservations are worked out afresh at every event.
"""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("fcfs", "easy", "conservative")


@dataclass(frozen=True)
class Job:
    """One job of a workload."""

    job_id: int
    submit: float
    gpus: int
    limit: float
    runtime: float


@dataclass(frozen=True)
class Outcome:
    """When a job started and ended."""

    job_id: int
    start: float
    end: float


@dataclass
class _Running:
    job: Job
    start: float

    @property
    def planned_end(self) -> float:
        return self.start + self.job.limit

    @property
    def end(self) -> float:
        return self.start + self.job.runtime


def _check(jobs: list[Job], total: int) -> None:
    seen: set[int] = set()
    for job in jobs:
        if job.job_id in seen:
            raise ValueError(f"job {job.job_id} appears twice")
        seen.add(job.job_id)
        if not 1 <= job.gpus <= total:
            raise ValueError(f"job {job.job_id} asks for {job.gpus} GPUs of {total}")
        if not 1 <= job.limit < float("inf"):
            raise ValueError(f"job {job.job_id}: time limit {job.limit} is not finite and >= 1")
        if not 0 <= job.runtime <= job.limit:
            raise ValueError(f"job {job.job_id}: run time {job.runtime} is not within 0..limit")


def simulate(jobs: list[Job], total: int, policy: str) -> dict[int, Outcome]:
    """Run ``jobs`` on a pool of ``total`` GPUs under ``policy``: each job's outcome."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}")
    _check(jobs, total)
    arrivals = sorted(jobs, key=lambda j: (j.submit, j.job_id))
    queue: list[Job] = []
    running: list[_Running] = []
    done: dict[int, Outcome] = {}
    free = total
    i = 0
    while i < len(arrivals) or running:
        times = [r.end for r in running]
        if i < len(arrivals):
            times.append(arrivals[i].submit)
        now = min(times)
        for r in [r for r in running if r.end == now]:
            running.remove(r)
            free += r.job.gpus
            done[r.job.job_id] = Outcome(r.job.job_id, r.start, r.end)
        while i < len(arrivals) and arrivals[i].submit == now:
            queue.append(arrivals[i])
            i += 1
        queue.sort(key=lambda j: (j.submit, j.job_id))
        for job in _choose(policy, queue, running, free, now):
            queue.remove(job)
            running.append(_Running(job, now))
            free -= job.gpus
    return done


def _choose(policy: str, queue: list[Job], running: list[_Running], free: int,
            now: float) -> list[Job]:
    """The jobs that start at ``now``, in the order they start."""
    if policy == "fcfs":
        return _fcfs(queue, free)
    if policy == "easy":
        return _easy(queue, running, free, now)
    return _conservative(queue, running, free, now)


def _fcfs(queue: list[Job], free: int) -> list[Job]:
    started = []
    for job in queue:
        if job.gpus > free:
            break
        started.append(job)
        free -= job.gpus
    return started


def _easy(queue: list[Job], running: list[_Running], free: int, now: float) -> list[Job]:
    started = _fcfs(queue, free)
    free -= sum(job.gpus for job in started)
    if len(started) == len(queue):
        return started
    head = queue[len(started)]
    gpus_at: dict[float, int] = {}  # planned end -> GPUs given back then
    for end, gpus in ([(r.planned_end, r.job.gpus) for r in running]
                      + [(now + job.limit, job.gpus) for job in started]):
        gpus_at[end] = gpus_at.get(end, 0) + gpus
    shadow, free_at_shadow = None, free
    for end in sorted(gpus_at):
        free_at_shadow += gpus_at[end]
        if free_at_shadow >= head.gpus:
            shadow = end
            break
    assert shadow is not None, "the head fits the empty pool, so it fits once all end"
    extra = free_at_shadow - head.gpus
    for job in queue[len(started) + 1:]:
        if job.gpus > free:
            continue
        if now + job.limit <= shadow:
            started.append(job)
            free -= job.gpus
        elif job.gpus <= extra:
            started.append(job)
            free -= job.gpus
            extra -= job.gpus
    return started


class _Profile:
    """Free GPUs over time from ``now`` on: a step function, as sorted breakpoints."""

    def __init__(self, now: float, free: int, ends: list[tuple[float, int]]) -> None:
        self.times = [now]
        self.free = [free]
        for at, gpus in sorted(ends):
            self._split(at)
            for k in range(self.times.index(at), len(self.times)):
                self.free[k] += gpus

    def _split(self, at: float) -> None:
        """Make ``at`` a breakpoint (the free count does not change there)."""
        if at in self.times:
            return
        k = len([t for t in self.times if t < at])
        self.times.insert(k, at)
        self.free.insert(k, self.free[k - 1])

    def earliest(self, gpus: int, length: float) -> float:
        """The first breakpoint ``s`` with at least ``gpus`` free throughout
        ``[s, s + length)``; past the last breakpoint everything running has ended."""
        for k, start in enumerate(self.times):
            if all(self.free[m] >= gpus for m in range(k, len(self.times))
                   if self.times[m] < start + length):
                return start
        raise AssertionError("a job that fits the empty pool fits after the last end")

    def take(self, start: float, length: float, gpus: int) -> None:
        """Hold ``gpus`` over ``[start, start + length)``."""
        self._split(start)
        self._split(start + length)
        for k, at in enumerate(self.times):
            if start <= at < start + length:
                self.free[k] -= gpus


def _conservative(queue: list[Job], running: list[_Running], free: int,
                  now: float) -> list[Job]:
    profile = _Profile(now, free, [(r.planned_end, r.job.gpus) for r in running])
    started = []
    for job in queue:
        at = profile.earliest(job.gpus, job.limit)
        profile.take(at, job.limit, job.gpus)
        if at == now:
            started.append(job)
    return started
