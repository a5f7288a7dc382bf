"""Job operations for users: cancel, hold, signal, requeue, each a guarded UPDATE; who
may act on a job; where started jobs run. The JOB object they answer with is built in
``db/job_views.py``."""

from __future__ import annotations

import pwd
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session

from gpusched.core.arrays import ArrayError, iter_tasks, parse_array, remove
from gpusched.db import commands
from gpusched.db.engine import rowcount
from gpusched.db.models import Job, Node
from gpusched.errors import Conflict, NotFound, PermissionDenied, UsageError


@dataclass(frozen=True)
class Identity:
    """Who is asking: uid and gid from the kernel, and the user name."""

    uid: int
    gid: int
    name: str | None = None  # known already; else looked up from uid
    admin: bool | None = None  # as the API decided ([controller] admin_group); None: root

    @property
    def user(self) -> str:
        """The login name of ``uid`` (the number itself if it has none)."""
        if self.name is not None:
            return self.name
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return str(self.uid)

    @property
    def is_admin(self) -> bool:
        """Whether the caller administers the cluster: as the API decided, else root."""
        return self.uid == 0 if self.admin is None else self.admin


def set_hold(session: Session, job_id: int, who: Identity, hold: bool) -> Job:
    """Hold a pending job (an admin's hold is an admin hold) or release it."""
    job = _owned_job(session, job_id, who, "hold or release")
    if not hold and job.hold == "admin" and not who.is_admin:
        raise PermissionDenied(f"job {job_id} is held by an administrator; only one may release it")
    value = ("admin" if who.is_admin else "user") if hold else None
    changed = rowcount(session.execute(
        update(Job).where(Job.id == job_id, Job.state == "PENDING").values(hold=value)))
    session.refresh(job)
    if not changed:
        raise Conflict(f"job {job_id} is {job.state}: only pending jobs can be held or released")
    return job


def _owned_job(session: Session, job_id: int, who: Identity, verb: str) -> Job:
    """The job, if it exists and ``who`` may ``verb`` it (its owner or an admin)."""
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"invalid job id specified: {job_id}")
    if job.uid != who.uid and not who.is_admin:
        raise PermissionDenied(f"job {job_id} belongs to {job.user_name}; you may {verb} only "
                               f"your own jobs")
    return job


def cancel_job(session: Session, job_id: int, who: Identity) -> tuple[Job, set[str]]:
    """Cancel a job, or every task of an array; returns the job and the nodes to wake."""
    job = _owned_job(session, job_id, who, "cancel")
    now = datetime.now(UTC)
    whole_array = job.array_job_id == job.id
    ids = Job.array_job_id == job_id if whole_array else Job.id == job_id
    done = rowcount(session.execute(
        update(Job).where(ids, Job.state == "PENDING")
        .values(state="CANCELLED", end_time=now, reason="None")
    ))
    nodes = stop_running(session, ids, cancel_requested_at=now)
    session.refresh(job)
    if not done and not nodes and session.scalar(
            select(Job.id).where(ids, Job.state == "RUNNING").limit(1)) is None:
        raise Conflict(f"every task of array job {job_id} has already ended" if whole_array
                       else f"job {job_id} has already ended ({job.state})")
    names = set(session.scalars(select(Node.name).where(Node.id.in_(nodes)))) if nodes else set()
    return job, names


def requeue_job(session: Session, job_id: int, who: Identity, hold: bool = False
                ) -> tuple[Job, set[str]]:
    """Stop a running job and put it back in the queue with its submit time, or put an
    ended one back (scontrol requeue; ``hold``: requeuehold, gpusched.db.requeue);
    returns the job and the nodes to wake."""
    from gpusched.db import requeue

    job = _owned_job(session, job_id, who, "requeue")
    if job.interactive:
        raise Conflict(f"job {job_id} is an allocation (galloc, gsrun): only batch jobs are "
                       "requeued")
    now = datetime.now(UTC)
    ids = Job.array_job_id == job_id if job.array_job_id == job.id else Job.id == job_id
    if hold:
        requeue.hold_running(session, ids, who)
    nodes = stop_running(session, ids, cancel_requested_at=now, preempted_at=now,
                         preempt_mode="requeue")
    if not nodes:
        requeue.requeue_ended(session, job, ids, who, hold)
        return job, set()
    return job, set(session.scalars(select(Node.name).where(Node.id.in_(nodes))))


def signal_job(session: Session, job_id: int, who: Identity, signum: int) -> tuple[Job, set[str]]:
    """Ask the agent to send ``signum`` to a running job (every task of an array) without
    ending it (but SIGKILL, which cancels it, as Slurm's scancel does); returns the job
    and the nodes to wake."""
    if not 1 <= signum < signal.NSIG:
        raise UsageError(f"signal: expected a signal number from 1 to {signal.NSIG - 1}")
    job = _owned_job(session, job_id, who, "signal")
    ids = Job.array_job_id == job_id if job.array_job_id == job.id else Job.id == job_id
    running = session.execute(select(Job.id, Job.restarts, Job.node_id).where(
        ids, Job.state == "RUNNING", Job.cancel_requested_at.is_(None))).all()
    commands.issue(session, "signal", _targets(running), {"signal": signum})
    nodes = {node_id for *_, node_id in running}
    if signum == signal.SIGKILL:  # as Slurm's: the job ends CANCELLED (agents.stopped_state)
        stop_running(session, Job.id.in_([job_id for job_id, *_ in running]),
                     cancel_requested_at=datetime.now(UTC))
    if not nodes:
        raise Conflict(f"job {job_id} is not running ({job.state})")
    return job, set(session.scalars(select(Node.name).where(Node.id.in_(nodes))))


def cancel_tasks(session: Session, array_id: int, who: Identity, tasks: str
                 ) -> tuple[Job, set[str]]:
    """Cancel some tasks of array ``array_id`` (``tasks``: ids such as ``3`` or ``1-5``):
    the started ones as jobs, the pending ones by taking them out of the array's record.
    Returns the record and the nodes to wake."""
    record = _owned_job(session, array_id, who, "cancel")
    if record.array_job_id != record.id:
        raise UsageError(f"job {array_id} is not a job array: give its id alone")
    try:
        wanted = set(iter_tasks(parse_array(tasks).tasks))
    except ArrayError as exc:
        raise UsageError(f"invalid task ids {tasks!r}: {exc}") from None
    now = datetime.now(UTC)
    started = (Job.array_job_id == array_id) & Job.array_task_id.in_(wanted)
    done = rowcount(session.execute(update(Job).where(started, Job.state == "PENDING")
                                    .values(state="CANCELLED", end_time=now, reason="None")))
    nodes = stop_running(session, started, cancel_requested_at=now)
    pending = record.array_tasks
    if pending is not None and wanted & set(iter_tasks(pending)):
        left = remove(pending, wanted)
        values: dict[str, Any] = {"array_tasks": left}
        if left is None:  # no task left to start: the record ends with them
            values.update(state="CANCELLED", end_time=now, reason="None")
        # Compare-and-swap on the text: a pass that started tasks meanwhile wins.
        if not rowcount(session.execute(update(Job).where(
                Job.id == array_id, Job.state == "PENDING", Job.array_tasks == pending)
                .values(**values))):
            raise Conflict(f"array job {array_id} changed while cancelling; try again")
        done += 1
    session.refresh(record)
    if not done and not nodes and session.scalar(select(Job.id).where(
            started, Job.state == "RUNNING").limit(1)) is None:
        raise Conflict(f"no task {tasks} of array job {array_id} is pending or running")
    names = set(session.scalars(select(Node.name).where(Node.id.in_(nodes)))) if nodes else set()
    return record, names


def stop_running(session: Session, which: ColumnElement[bool], **values: Any) -> set[int]:
    """Ask the running jobs of ``which`` not yet being stopped to stop (setting
    ``values``, ``cancel_requested_at`` among them): a ``cancel`` command to each one's
    node, in this transaction. An allocation (no batch script) ends CANCELLED at once,
    its steps with it. The ids of the nodes told."""
    stopping = session.execute(
        update(Job).where(which, Job.state == "RUNNING", Job.cancel_requested_at.is_(None))
        .values(**values).returning(Job.id, Job.restarts, Job.node_id, Job.interactive)).all()
    batch = [(job_id, run, node) for job_id, run, node, interactive in stopping
             if not interactive]
    commands.issue(session, "cancel", _targets(batch))
    told = {node_id for *_, node_id in batch if node_id is not None}
    allocations = [job_id for job_id, *_, interactive in stopping if interactive]
    if allocations:
        from gpusched.db.allocations import cancel_allocations  # it imports this module

        told |= cancel_allocations(session, allocations)
    return told


def _targets(rows: Iterable[tuple[int, int, int | None]]) -> list[commands.Target]:
    """(job, run, node) of the started jobs among ``rows``."""
    return [(job_id, run, node_id) for job_id, run, node_id in rows if node_id is not None]
