"""Node failure and fencing by run.

A node whose agent has been silent for ``node_timeout`` is lost: DOWN with Slurm's
reason ``NotResponding`` (a drained node stays DRAIN with its reason), and each job
running on it ends as if the node had died with it: a cancel in progress completes
(CANCELLED), a requeue in progress (preemption, ``gcontrol requeue``, a failed GPU)
puts the job back in the queue, and any other job ends ``NODE_FAIL``, requeued when it
may be (its ``--requeue``/``--no-requeue``, else its partition's default: yes). Its GPUs
are freed on every node, and a job's batch script still running on a node that is
alive is killed.

The lost node's agent may still be there (frozen, cut off) with those runs going on.
Until it registers again it gets no work; at registration it names the runs it holds,
and each that is not a current run of a job on that node is killed (``kill``
commands, also in the registration's answer) before it claims anything new.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import case, select, update
from sqlalchemy.orm import Session

from gpusched.core import bounds
from gpusched.db import commands, steps
from gpusched.db.agents import release_job, requeued
from gpusched.db.engine import rowcount
from gpusched.db.health import may_requeue
from gpusched.db.models import Job, Node
from gpusched.errors import UsageError

NOT_RESPONDING = "NotResponding"


@dataclass
class LostNodes:
    """What marking silent nodes lost did."""

    nodes: list[str] = field(default_factory=list)
    node_failed: list[int] = field(default_factory=list)  # ended NODE_FAIL
    requeued: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)  # GPU failure, not requeued
    kill_on: set[str] = field(default_factory=set)  # live nodes told to kill a run


def fail_silent_nodes(session: Session, timeout: float) -> LostNodes:
    """Mark nodes silent for ``timeout`` seconds lost and end the jobs running on them
    (the caller holds the leader epoch in this transaction)."""
    now = datetime.now(UTC)
    lost = session.execute(
        update(Node).where(Node.lost_at.is_(None), Node.state.in_(("UP", "DRAIN")),
                           Node.last_seen < now - timedelta(seconds=timeout))
        .values(lost_at=now, state=case((Node.state == "DRAIN", "DRAIN"), else_="DOWN"),
                reason=case((Node.state == "DRAIN", Node.reason), else_=NOT_RESPONDING))
        .returning(Node.id, Node.name)).all()
    result = LostNodes(nodes=sorted(name for _, name in lost))
    if not lost:
        return result
    lost_ids = {node_id for node_id, _ in lost}
    names = {node_id: name for node_id, name in lost}
    on_lost = Job.node_id.in_(lost_ids) | Job.node_names.overlap(result.nodes)
    for job in session.scalars(select(Job).where(Job.state == "RUNNING", on_lost)
                               .order_by(Job.id).with_for_update()):
        batch_node, run = job.node_id, job.restarts
        dead = names.get(batch_node or 0) or next(
            n for n in job.node_names or () if n in result.nodes)
        _end_on_lost_node(session, job, dead, now, result)
        if batch_node is not None and batch_node not in lost_ids:
            # A multi-node job lost one of its other nodes: its batch script lives on.
            commands.issue(session, "kill", [(job.id, run, batch_node)])
            result.kill_on.update(session.scalars(select(Node.name).where(
                Node.id == batch_node)))
    return result


def _end_on_lost_node(session: Session, job: Job, node: str, now: datetime,
                      result: LostNodes) -> None:
    """End the current run of ``job``, which was running on lost ``node``."""
    failure = f"node {node} failed ({NOT_RESPONDING})"
    run, job_nodes = job.restarts, tuple(job.node_names or (node,))
    values: dict[str, Any]
    if job.gpu_failure is not None:
        done = result.requeued if may_requeue(session, job) else result.failed
        values = (requeued(f"requeued: {job.gpu_failure}") if done is result.requeued else
                  {"state": "FAILED", "end_time": now, "error_message": job.gpu_failure})
    elif job.preempted_at is not None and job.preempt_mode == "requeue":
        done, values = result.requeued, requeued(job.error_message)
    elif job.cancel_requested_at is not None:
        done = result.cancelled
        values = {"state": "CANCELLED", "end_time": now, "error_message":
                  f"preempted by job {job.preempted_by}" if job.preempted_at is not None
                  else f"cancelled; {failure} before it stopped"}
    elif may_requeue(session, job):
        done, values = result.requeued, requeued(f"requeued after NODE_FAIL: {failure}")
    else:
        done = result.node_failed
        values = {"state": "NODE_FAIL", "end_time": now, "error_message": failure}
    if rowcount(session.execute(update(Job).where(
            Job.id == job.id, Job.state == "RUNNING", Job.restarts == job.restarts)
            .values(**values))):
        release_job(session, job.id)
        done.append(job.id)
        # Its steps end with it; the batch node's kill is made by the caller.
        result.kill_on.update(steps.end_with_job(
            session, job.id, run, job_nodes, values["state"], skip=job_nodes[:1],
            lost=result.nodes))


def parse_runs(raw: object) -> list[tuple[int, int]]:
    """The ``runs`` of a registration: [{"job_id", "run"}] the agent holds."""
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > bounds.MAX_LIST:
        raise UsageError(f"runs: expected a list of at most {bounds.MAX_LIST} "
                         "{job_id, run} objects")
    runs = []
    for item in raw:
        job_id = item.get("job_id") if isinstance(item, dict) else None
        run = item.get("run") if isinstance(item, dict) else None
        if not isinstance(item, dict) or set(item) != {"job_id", "run"} \
                or not isinstance(job_id, int) or not _whole(job_id, 1, bounds.MAX_JOB_ID) \
                or not isinstance(run, int) or not _whole(run, 0, bounds.MAX_INT32):
            raise UsageError(f"runs: expected {{job_id, run}} with a job id and a restart "
                             f"count, got {str(item)[:100]!r}")
        runs.append((job_id, run))
    return runs


def _whole(value: int, low: int, high: int) -> bool:
    return not isinstance(value, bool) and low <= value <= high


def fence_runs(session: Session, node: Node, runs: list[tuple[int, int]]
               ) -> list[tuple[int, int]]:
    """The runs of ``runs`` (job id, run) that ``node`` must kill: every one that is not
    the current run of a job running there. Each becomes a ``kill`` command too (for a
    job this database knows), so that an agent that forgets the answer still learns."""
    if not runs:
        return []
    ids = {job_id for job_id, _ in runs}
    current = set(session.execute(select(Job.id, Job.restarts).where(
        Job.id.in_(ids), Job.state == "RUNNING", Job.node_id == node.id)).all())
    stale = sorted(set(runs) - current)
    known = set(session.scalars(select(Job.id).where(Job.id.in_({j for j, _ in stale})))) \
        if stale else set()
    commands.issue(session, "kill", [(job_id, run, node.id) for job_id, run in stale
                                     if job_id in known])
    return stale
