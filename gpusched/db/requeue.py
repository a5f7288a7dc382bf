"""scontrol's requeue of a finished batch job, and requeuehold: the job (or every ended
task of an array) goes back to the queue with its submit time, as its next run (one
restart more); with ``hold``, held as ``gcontrol hold`` holds it."""

from __future__ import annotations

from sqlalchemy import ColumnElement, update
from sqlalchemy.orm import Session

from gpusched.db.agents import requeued
from gpusched.db.jobs import Identity
from gpusched.db.models import Job
from gpusched.db.notify import notify_in
from gpusched.errors import Conflict

LIVE_STATES = ("PENDING", "RUNNING", "SUSPENDED")


def hold_value(who: Identity) -> str:
    """The hold ``who`` places: an administrator's, or the user's own."""
    return "admin" if who.is_admin else "user"


def requeue_ended(session: Session, job: Job, which: ColumnElement[bool], who: Identity,
                  hold: bool) -> int:
    """Put the ended jobs of ``which`` (``job`` or its array's tasks) back in the queue,
    cleared of how their last run ended; the number requeued. A Conflict when none has
    ended (a pending job is not requeued)."""
    values = {**requeued(None), "end_time": None, "exit_code": None, "signal": None,
              "idle_action": None, "idle_action_at": None, "idle_reason": None,
              "hold": hold_value(who) if hold else None}
    done = session.execute(update(Job).where(which, Job.state.not_in(LIVE_STATES))
                           .values(**values).returning(Job.id)).scalars().all()
    if not done:
        raise Conflict(f"job {job.id} is {job.state}: only running and ended batch jobs are "
                       "requeued")
    notify_in(session, "sched")
    return len(done)


def hold_running(session: Session, which: ColumnElement[bool], who: Identity) -> None:
    """requeuehold of running jobs: they come back to the queue held."""
    session.execute(update(Job).where(which, Job.state == "RUNNING").values(hold=hold_value(who)))
