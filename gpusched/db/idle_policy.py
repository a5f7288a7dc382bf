"""The idle-GPU policy applied after each agent's samples: warn the running jobs of a
node whose GPUs stayed idle, then requeue or cancel them (gpusched.core.idle_policy
says what is due; this module does it, in the samples' transaction).

A warning is a ``notice`` command to the node running the job's batch script: the
job's supervisor writes the line into the job's output file as the job's user
(gpusched.agent.notices). Requeue and cancel go the way a user's or an
administrator's do (``stop_running``), with the action and its reason recorded on the
job (``idle_action``, ``idle_action_at``, ``idle_reason``).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session

from gpusched.core.idle_policy import IdlePolicy, due, effective, policy_from
from gpusched.db import commands
from gpusched.db.engine import rowcount
from gpusched.db.jobs import stop_running
from gpusched.db.models import Allocation, Gpu, Job, Node, Partition, Qos

# A notice is one line of at most this many characters (messages/agent.py bounds it).
MAX_NOTICE_LINE = 1000


def _policies(session: Session, jobs: list[Job]) -> dict[int, IdlePolicy | None]:
    """The policy each job is under (its QOS's, else its partition's)."""
    parts = {p.name: policy_from(f"partition {p.name}", p.idle_action, p.idle_warn_after,
                                 p.idle_action_after)
             for p in session.scalars(select(Partition).where(
                 Partition.name.in_({j.partition for j in jobs})))}
    qos = {q.name: policy_from(f"QOS {q.name}", q.idle_action, q.idle_warn_after,
                               q.idle_action_after)
           for q in session.scalars(select(Qos).where(
               Qos.name.in_({j.qos for j in jobs if j.qos is not None})))}
    return {j.id: effective(parts.get(j.partition), qos.get(j.qos) if j.qos else None)
            for j in jobs}


def notice_line(job_id: int, now: datetime, text: str) -> str:
    """The line a job's output gets: who says it, which job, when, and what."""
    line = f"gpusched: job {job_id}: {now.strftime('%Y-%m-%dT%H:%M:%S')}: {text}"
    return line[:MAX_NOTICE_LINE]


def _notify(session: Session, job: Job, text: str, now: datetime) -> None:
    if job.node_id is not None and not job.interactive:  # an allocation has no output file
        commands.issue(session, "notice", [(job.id, job.restarts, job.node_id)],
                       {"text": notice_line(job.id, now, text)})


def enforce(session: Session, node_name: str, idle_percent: float) -> set[str]:
    """Warn, requeue or cancel the running jobs on ``node_name``'s GPUs as their idle
    policy says (after their samples were recorded); the names of the nodes whose
    agents have new commands."""
    now = datetime.now(UTC)
    on_node = (select(Allocation.job_id).join(Gpu, Gpu.id == Allocation.gpu_id)
               .join(Node, Node.id == Gpu.node_id)
               .where(Node.name == node_name, Allocation.released_at.is_(None)))
    jobs = list(session.scalars(select(Job).where(
        Job.id.in_(on_node), Job.state == "RUNNING", Job.cancel_requested_at.is_(None),
        Job.suspended_at.is_(None),  # suspended by an administrator: not idle
        (Job.idle_since.is_not(None) | Job.idle_warned_at.is_not(None))).order_by(Job.id)))
    if not jobs:
        return set()
    policies = _policies(session, jobs)
    told: set[int] = set()
    for job in jobs:
        # Busy again after a warning, or no policy any more (an admin apply took it
        # away): the warning is lifted.
        lifted = ("its GPUs are busy again" if job.idle_since is None else
                  "no idle policy applies to it any more" if policies[job.id] is None else None)
        if lifted is not None:
            if job.idle_warned_at is not None and _guarded(
                    session, job, Job.idle_warned_at.is_not(None), idle_warned_at=None):
                _notify(session, job, f"{lifted}; the idle warning is lifted", now)
                told.add(job.node_id or 0)
            continue
        step = due(policies[job.id], job.idle_since, job.idle_warned_at, now, idle_percent)
        if step is None:
            continue
        if step.step == "warn":
            if _guarded(session, job, Job.idle_warned_at.is_(None), idle_warned_at=now):
                _notify(session, job, f"warning: {step.message}", now)
                told.add(job.node_id or 0)
            continue
        told |= _act(session, job, step.step, step.reason, now)
    told.discard(0)
    return set(session.scalars(select(Node.name).where(Node.id.in_(told)))) if told else set()


def _guarded(session: Session, job: Job, expected: ColumnElement[bool], **values: object
             ) -> bool:
    """Change the job's run as ``values`` say if it is still the run it was and
    ``expected`` holds (another agent's samples may have got there first)."""
    return bool(rowcount(session.execute(update(Job).where(
        Job.id == job.id, Job.state == "RUNNING", Job.restarts == job.restarts,
        Job.cancel_requested_at.is_(None), expected).values(**values))))


def _act(session: Session, job: Job, action: str, reason: str, now: datetime) -> set[int]:
    """Requeue or cancel one job for idling; the ids of the nodes told. A job that may
    not be requeued (``--no-requeue``, or an allocation) is cancelled instead."""
    if action == "requeue" and (job.requeue is False or job.interactive):
        action = "cancel"
        reason += "; cancelled instead of requeued: the job may not be requeued"
    done = "requeued" if action == "requeue" else "cancelled"
    # Recorded first, guarded: the row is then this transaction's, and the line for the
    # output goes out before the cancel that ends the run.
    if not _guarded(session, job, Job.idle_warned_at.is_not(None), idle_action=action,
                    idle_action_at=now, idle_reason=reason, idle_warned_at=None,
                    idle_since=None, idle=False):
        return set()
    _notify(session, job, f"{done}: its {reason}", now)
    values: dict[str, object] = {"cancel_requested_at": now}
    if action == "requeue":
        values.update(preempted_at=now, preempt_mode="requeue",
                      error_message=f"requeued: {reason}")
    nodes = stop_running(session, Job.id == job.id, **values)
    return nodes | ({job.node_id} if job.node_id is not None else set())
