"""Job control (scontrol's job side): array task references, suspend and resume,
``top``. Each change is a guarded UPDATE naming the state it expects.

Suspending keeps the job RUNNING with its GPUs; ``suspended_at`` marks it, the listings
show it SUSPENDED, and every node of the job gets a ``suspend`` command (its agent stops
or continues every process of the job there: gpusched.agent.suspend). The time it spends
suspended goes into ``suspended_seconds`` on resume and is added to its time limit, as
Slurm does not count it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import (
    ColumnElement,
    TextClause,
    and_,
    case,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.orm import Session

from gpusched.core.arrays import remove
from gpusched.core.jobcontrol import JobRef, effective_limit, suspended_seconds, task_in
from gpusched.db import commands
from gpusched.db.engine import rowcount
from gpusched.db.jobs import Identity, _owned_job
from gpusched.db.models import Job, JobStep, Node
from gpusched.errors import Conflict, NotFound, PermissionDenied
from gpusched.messages.jobcontrol import SuspendJob

# A running job an administrator suspended is listed SUSPENDED (Slurm's state); it
# stays RUNNING in the table, with its GPUs, for everything else.
STATE_SQL = case((and_(Job.state == "RUNNING", Job.suspended_at.is_not(None)), "SUSPENDED"),
                 else_=Job.state)


def shown_state(state: str, suspended_at: datetime | None) -> str:
    """The state a listing shows: SUSPENDED for a suspended running job."""
    return "SUSPENDED" if state == "RUNNING" and suspended_at is not None else state


def state_condition(states: Sequence[str]) -> ColumnElement[bool]:
    """Jobs in any of ``states`` as listings show them (RUNNING leaves out suspended
    jobs, SUSPENDED takes only them)."""
    stored = [s for s in states if s not in ("RUNNING", "SUSPENDED")]
    parts: list[ColumnElement[bool]] = [Job.state.in_(stored)] if stored else []
    if "RUNNING" in states:
        parts.append(and_(Job.state == "RUNNING", Job.suspended_at.is_(None)))
    if "SUSPENDED" in states:
        parts.append(and_(Job.state == "RUNNING", Job.suspended_at.is_not(None)))
    return or_(*parts) if parts else Job.state.in_(())


def _split_statement() -> TextClause:
    """A pending task split off its array's record, to be acted on alone (held,
    updated): a PENDING row of its own, as a requeued task is."""
    from gpusched.db.schedule import _TASK_COPIES

    return text(
        f"INSERT INTO jobs ({', '.join(_TASK_COPIES)}, array_task_id, state, reason, hold, "
        f"top_rank) SELECT {', '.join('j.' + c for c in _TASK_COPIES)}, :task, 'PENDING', "
        "j.reason, j.hold, j.top_rank FROM jobs AS j WHERE j.id = :record RETURNING id")


def resolve_ref(session: Session, ref: JobRef, who: Identity | None = None) -> int:
    """The row that ``ref`` names: the job itself, or the row of array task
    ``job_TASK`` (one that started, or was split off, has a row of its own). A task still
    pending in its array's record is split off into a row of its own when ``who`` (an
    acting caller) may act on the array, else the record answers for it. NotFound when
    no such job or task exists."""
    if ref.task is None:
        return ref.job_id
    own = session.scalar(select(Job.id).where(Job.array_job_id == ref.job_id,
                                              Job.array_task_id == ref.task,
                                              Job.array_tasks.is_(None)))
    if own is not None:
        return own
    record = session.get(Job, ref.job_id)
    if record is None or record.array_job_id != ref.job_id \
            or not task_in(record.array_tasks, ref.task):
        raise NotFound(f"invalid job id specified: {ref.text()}")
    if who is None or (record.uid != who.uid and not who.is_admin):
        return record.id
    return split_pending_task(session, record, ref.task)


def split_pending_task(session: Session, record: Job, task: int) -> int:
    """Move pending task ``task`` out of its array's record into a PENDING row of its
    own; that row's id (the record's own when it was the last task)."""
    assert record.array_tasks is not None
    left = remove(record.array_tasks, (task,))
    values: dict[str, object] = {"array_tasks": left}
    if left is None:  # the last pending task: the record itself becomes it
        values["array_task_id"] = task
    swapped = rowcount(session.execute(update(Job).where(
        Job.id == record.id, Job.state == "PENDING", Job.array_tasks == record.array_tasks)
        .values(**values)))
    if not swapped:
        raise Conflict(f"array {record.id} changed while task {task} was being split off; "
                       "try again")
    if left is None:
        return record.id
    # The record's task text was compared and swapped above: no second split of it.
    return int(session.execute(_split_statement(), {"task": task, "record": record.id})
               .scalar_one())


def ref_condition(refs: Sequence[JobRef]) -> ColumnElement[bool]:
    """The jobs a listing of ``refs`` shows: a job id shows the job and, for an array,
    all its tasks; ``12_3`` the row of task 3, or the array's pending record while task 3
    waits in it."""
    whole = [ref.job_id for ref in refs if ref.task is None]
    parts: list[ColumnElement[bool]] = []
    if whole:
        parts.append(or_(Job.id.in_(whole), Job.array_job_id.in_(whole)))
    for ref in refs:
        if ref.task is not None:
            parts.append(and_(Job.array_job_id == ref.job_id, or_(
                and_(Job.array_task_id == ref.task, Job.array_tasks.is_(None)),
                func.gpusched_task_in(Job.array_tasks, ref.task))))
    return or_(*parts)


# -- suspend and resume ---------------------------------------------------------------


def job_nodes(session: Session, job: Job) -> dict[str, int]:
    """Every node of a running job (its batch node, the other nodes of its allocation
    and those of its running steps), by name: node id."""
    names = set(job.node_names or ())
    names.update(n for row in session.execute(select(JobStep.node_names).where(
        JobStep.job_id == job.id, JobStep.run == job.restarts, JobStep.state == "RUNNING"))
        for n in row[0])
    return dict(session.execute(select(Node.name, Node.id).where(
        (Node.id == job.node_id) | Node.name.in_(sorted(names)))).all())


def suspend_job(session: Session, job_id: int, who: Identity, suspend: bool,
                now: datetime | None = None) -> tuple[Job, set[str]]:
    """Suspend a running job, or resume a suspended one (administrators only, as in
    Slurm); the job and the nodes whose agents act."""
    if not who.is_admin:
        raise PermissionDenied("only an administrator may suspend or resume a job")
    job = _owned_job(session, job_id, who, "suspend or resume")
    verb = "suspended" if suspend else "resumed"
    if job.state != "RUNNING":
        raise Conflict(f"job {job_id} is {job.state}: only a running job can be {verb}")
    if suspend and job.suspended_at is not None:
        raise Conflict(f"job {job_id} is already suspended")
    if not suspend and job.suspended_at is None:
        raise Conflict(f"job {job_id} is not suspended")
    if suspend and (job.cancel_requested_at is not None or job.preempted_at is not None):
        raise Conflict(f"job {job_id} is being stopped: it cannot be suspended")
    if suspend and job.launched_at is None:  # its node may not have started it yet
        raise Conflict(f"job {job_id} is still starting (its node has not confirmed the "
                       "launch): suspend it once it runs")
    now = now or datetime.now(UTC)
    guard = [Job.id == job_id, Job.state == "RUNNING", Job.restarts == job.restarts]
    # Its GPUs' idle time (the idle-GPU policy) starts again after a suspension.
    if suspend:
        values: dict[str, object] = {"suspended_at": now, "idle_since": None, "idle": False}
        guard.append(Job.suspended_at.is_(None))
    else:
        assert job.suspended_at is not None
        total = suspended_seconds(job.suspended_seconds, job.suspended_at.timestamp(),
                                  now.timestamp())
        values = {"suspended_at": None, "suspended_seconds": total, "idle_since": None,
                  "idle": False}
        guard.append(Job.suspended_at == job.suspended_at)
    if not rowcount(session.execute(update(Job).where(*guard).values(**values))):
        raise Conflict(f"job {job_id} changed while it was being {verb}")
    session.refresh(job)
    nodes = job_nodes(session, job)
    commands.issue(session, "suspend", [(job.id, job.restarts, nodes[n]) for n in sorted(nodes)],
                   _payload(job, suspend).to_json())
    return job, set(nodes)


def suspend_jobs(session: Session, job_id: int, who: Identity, suspend: bool
                 ) -> tuple[Job, set[str]]:
    """``suspend_job`` for a job, or, for an array's id, for each of its running tasks
    that is not (suspend) or is (resume) suspended, as scontrol does; the job named and
    the nodes whose agents act."""
    job = _owned_job(session, job_id, who, "suspend or resume")
    if job.array_job_id != job.id:
        return suspend_job(session, job_id, who, suspend)
    waiting = Job.suspended_at.is_(None) if suspend else Job.suspended_at.is_not(None)
    tasks = session.scalars(select(Job.id).where(
        Job.array_job_id == job_id, Job.state == "RUNNING", waiting).order_by(Job.id)).all()
    if not tasks:
        return suspend_job(session, job_id, who, suspend)  # says why not
    nodes: set[str] = set()
    for task in tasks:
        nodes |= suspend_job(session, task, who, suspend)[1]
    session.refresh(job)
    return job, nodes


def _payload(job: Job, suspend: bool) -> SuspendJob:
    """What the agents need: on resume, the limit from the run's start with the time
    suspended added, and when its steps end."""
    if suspend:
        return SuspendJob(True)
    limit = effective_limit(job.time_limit, job.suspended_seconds)
    began = job.launched_at or job.start_time
    deadline = None if limit is None or began is None else began.timestamp() + limit
    return SuspendJob(False, limit, deadline)


# -- top --------------------------------------------------------------------------------


def top_jobs(session: Session, job_ids: Sequence[int], who: Identity) -> list[Job]:
    """Move pending jobs ahead of their owner's other pending jobs of the same
    partition, account and QOS, the first named first (scontrol top). Users may top
    their own jobs (nothing moves past another user's job); administrators anyone's."""
    jobs = [_owned_job(session, job_id, who, "move") for job_id in job_ids]
    for job in jobs:
        if job.state != "PENDING":
            raise Conflict(f"job {job.id} is {job.state}: only pending jobs can be moved "
                           "to the top")
    uids = sorted({job.uid for job in jobs})
    base = session.scalar(select(func.coalesce(func.max(Job.top_rank), 0)).where(
        Job.uid.in_(uids))) or 0
    for at, job in enumerate(jobs):
        rank = base + len(jobs) - at
        if not rowcount(session.execute(update(Job).where(
                Job.id == job.id, Job.state == "PENDING").values(top_rank=rank))):
            raise Conflict(f"job {job.id} changed state while it was being moved")
    for job in jobs:
        session.refresh(job)
    return jobs
