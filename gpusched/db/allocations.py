"""Allocations: jobs without a batch script (``interactive``), made by ``galloc`` and by
``gsrun`` outside a job. Their start launches nothing; their client runs steps on them,
says it is alive (``heartbeat``: ``client_seen``) and ends them (``complete``) with its
command's exit status. The leader's periodic check (``check_allocations``) ends those
whose client went silent for the grace (CANCELLED, "client lost") and those past their
time limit (TIMEOUT): no supervisor on a node does that for them.

An allocation's end is a job's end as any other: its GPUs are freed, its running steps
end with it and every node of it is told to kill what the job still runs there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import false, func, or_, select, update
from sqlalchemy.orm import Session

from gpusched.db import steps
from gpusched.db.agents import past_limit, release_job
from gpusched.db.engine import rowcount
from gpusched.db.jobs import Identity, _owned_job
from gpusched.db.models import Job, Node
from gpusched.errors import Conflict

MIN_GRACE = 5.0  # seconds: bounds of [scheduler] allocation_grace
MAX_GRACE = 86_400.0
CLIENT_LOST = "client lost"  # how an allocation whose client went silent ends


@dataclass
class CheckedAllocations:
    """What one periodic check ended: job ids by the state they ended in, and the nodes
    told to kill what those jobs ran there."""

    ended: dict[str, list[int]] = field(default_factory=dict)
    kill_on: set[str] = field(default_factory=set)

    def add(self, job_id: int, state: str) -> None:
        """Note that ``job_id`` ended ``state``."""
        self.ended.setdefault(state, []).append(job_id)


def _allocation(session: Session, job_id: int, who: Identity, verb: str) -> Job:
    """The job, if ``who`` may ``verb`` it and it is an allocation."""
    job = _owned_job(session, job_id, who, verb)
    if not job.interactive:
        raise Conflict(f"job {job_id} is a batch job, not an allocation: it ends when its "
                       "script does (gcancel ends it sooner)")
    return job


def heartbeat(session: Session, job_id: int, who: Identity) -> Job:
    """The client of allocation ``job_id`` is alive: ``client_seen`` becomes now. Only a
    pending or running allocation's owner (or an admin) may say so."""
    job = _allocation(session, job_id, who, "keep alive")
    changed = rowcount(session.execute(
        update(Job).where(Job.id == job_id, Job.interactive,
                          Job.state.in_(("PENDING", "RUNNING")))
        .values(client_seen=func.now())))
    session.refresh(job)
    if not changed:
        raise Conflict(f"job {job_id} has ended ({job.state})")
    return job


def complete(session: Session, job_id: int, who: Identity, exit_code: int) -> set[str]:
    """End running allocation ``job_id`` as its client's command ended: COMPLETED for
    exit status 0, else FAILED with it. The nodes told to kill what it still runs."""
    job = _allocation(session, job_id, who, "end")
    if job.state == "PENDING":
        raise Conflict(f"job {job_id} is PENDING: it has not started; cancel it instead "
                       f"(gcancel {job_id})")
    if job.state != "RUNNING":
        raise Conflict(f"job {job_id} has already ended ({job.state})")
    ended = end_allocation(session, job, "COMPLETED" if exit_code == 0 else "FAILED",
                           exit_code=exit_code)
    if ended is None:
        session.refresh(job)
        raise Conflict(f"job {job_id} has already ended ({job.state})")
    return ended


def end_allocation(session: Session, job: Job, state: str, *, exit_code: int | None = None,
                   error: str | None = None) -> set[str] | None:
    """End running allocation ``job``'s current run ``state``: its GPUs are freed, its
    running steps end with it, and each of its nodes is told to kill what the job runs
    there. The nodes told (None: it was not running that run any more)."""
    run = job.restarts
    changed = rowcount(session.execute(
        update(Job).where(Job.id == job.id, Job.interactive, Job.state == "RUNNING",
                          Job.restarts == run)
        .values(state=state, end_time=func.now(), exit_code=exit_code, error_message=error)))
    if not changed:
        return None
    release_job(session, job.id)
    nodes = nodes_of(session, job)
    # No agent runs anything of it but its steps: every node of it is told, the first too.
    return steps.end_with_job(session, job.id, run, nodes, state)


def nodes_of(session: Session, job: Job) -> list[str]:
    """The nodes a started job runs on, its first (batch) node first; [] before."""
    if job.node_names:
        return list(job.node_names)
    if job.node_id is None:
        return []
    return list(session.scalars(select(Node.name).where(Node.id == job.node_id)))


def check_allocations(session: Session, grace: float, now: datetime, silent_too: bool = True
                      ) -> CheckedAllocations:
    """End the allocations whose client has been silent for ``grace`` seconds (CANCELLED,
    "client lost"; only when ``silent_too``), the running ones past their time limit
    (TIMEOUT), and the running ones being stopped (preempted: CANCELLED). Rows another
    transaction holds wait for the next check."""
    result = CheckedAllocations()
    silent_since = now - timedelta(seconds=grace)
    silent = (func.coalesce(Job.client_seen, Job.submit_time) < silent_since) if silent_too \
        else false()
    running = Job.state == "RUNNING"
    past_limit = running & Job.time_limit.is_not(None) & Job.suspended_at.is_(None) & (
        Job.start_time + func.make_interval(0, 0, 0, 0, 0, 0, Job.time_limit
                                            + Job.suspended_seconds) <= now)
    stopping = running & Job.cancel_requested_at.is_not(None)
    lost = f"{CLIENT_LOST}: no word from its galloc or gsrun for {grace:g} s"
    for job in session.scalars(
            select(Job).where(Job.interactive, Job.state.in_(("PENDING", "RUNNING")),
                              or_(silent, past_limit, stopping))
            .order_by(Job.id).with_for_update(skip_locked=True)):
        if job.state == "PENDING":  # picked for its silence: nothing else ends it here
            if rowcount(session.execute(
                    update(Job).where(Job.id == job.id, Job.state == "PENDING")
                    .values(state="CANCELLED", end_time=now, reason="None",
                            error_message=lost))):
                result.add(job.id, "CANCELLED")
            continue
        state, error = _why_it_ends(job, now, silent_since, lost)
        told = end_allocation(session, job, state, error=error)
        if told is not None:
            result.add(job.id, state)
            result.kill_on.update(told)
    return result


def _why_it_ends(job: Job, now: datetime, silent_since: datetime, lost: str
                 ) -> tuple[str, str | None]:
    """The state and error a running allocation the check picked ends with."""
    assert job.start_time is not None
    if past_limit(job, now):
        return "TIMEOUT", None
    if job.cancel_requested_at is not None:
        return "CANCELLED", (f"preempted by job {job.preempted_by}"
                             if job.preempted_at is not None else None)
    return "CANCELLED", lost


def cancel_allocations(session: Session, job_ids: list[int]) -> set[int]:
    """End running allocations ``job_ids`` CANCELLED (gcancel); the ids of the nodes told
    to kill what they ran."""
    told: set[str] = set()
    for job in session.scalars(select(Job).where(Job.id.in_(job_ids)).order_by(Job.id)):
        told |= end_allocation(session, job, "CANCELLED") or set()
    return set(session.scalars(select(Node.id).where(Node.name.in_(told)))) if told else set()
