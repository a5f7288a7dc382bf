"""Node commands: the work a node's agent must do (launch, cancel, signal, a new time
limit, kill an ended run and its steps, start or end its part of a job step), one row
each in ``node_commands``.

A command is made in the transaction that decides it, stamped with the job's run (its
``restarts`` then) and the leader epoch. The agent's poll claims its node's open
commands with ``FOR UPDATE SKIP LOCKED`` (two polls never get the same one) and the
agent acknowledges each once done; a claimed command left unacknowledged for
``RECLAIM_AFTER`` seconds, or when its agent registers again, is handed out again, so
agents act idempotently. A command whose run is over when it is handed out (the job
ended, was requeued, or no longer runs on that node) is closed instead of sent: nothing
meant for an earlier run reaches a later one. ``kill`` commands are always sent; the
agent kills the run only if it still holds that very run.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, insert, select, text, update
from sqlalchemy.orm import Session

from gpusched.db.engine import rowcount
from gpusched.db.models import Job, JobScript, Node, NodeCommand
from gpusched.db.placements import job_placements
from gpusched.messages import LaunchOrder
from gpusched.messages import NodeCommand as CommandMessage
from gpusched.messages.agent import LimitJob, SignalJob
from gpusched.messages.steps import StepCancel, StepLaunch

if TYPE_CHECKING:
    from gpusched.messages.agent import Payload

RECLAIM_AFTER = 60.0  # seconds a claimed command waits for its acknowledgement
MAX_PER_POLL = 200  # commands one poll takes; the next poll takes the rest at once

# (job id, run, node id) of a command to make.
Target = tuple[int, int, int]


def issue(session: Session, kind: str, targets: Iterable[Target],
          payload: dict[str, Any] | None = None, epoch: int | None = None) -> int:
    """Make a ``kind`` command for each (job, run, node) of ``targets``, stamped with
    ``epoch`` (None: the epoch in force, for commands users' requests make on any
    controller); how many were made."""
    rows = [{"job_id": job_id, "run": run, "node_id": node_id, "kind": kind,
             "payload": payload or {}} for job_id, run, node_id in targets]
    if not rows:
        return 0
    stamp: Any = epoch if epoch is not None else (
        select(text("epoch")).select_from(text("leader")).where(text("id = 1"))
        .scalar_subquery())
    session.execute(insert(NodeCommand).values(epoch=stamp), rows)
    return len(rows)


def has_open(session: Session, node_id: int) -> bool:
    """Whether ``node_id`` has commands not yet done (claimed or not)."""
    return session.scalar(select(NodeCommand.id).where(
        NodeCommand.node_id == node_id, NodeCommand.done_at.is_(None)).limit(1)) is not None


def claim(session: Session, node: Node, reclaim_after: float = RECLAIM_AFTER,
          limit: int = MAX_PER_POLL) -> list[CommandMessage]:
    """Claim ``node``'s open commands, oldest first, skipping those another transaction
    holds; close the stale ones and return the rest as messages."""
    now = datetime.now(UTC)
    free = (NodeCommand.claimed_at.is_(None)
            | (NodeCommand.claimed_at < now - timedelta(seconds=reclaim_after)))
    wanted = (select(NodeCommand.id).where(NodeCommand.node_id == node.id,
                                           NodeCommand.done_at.is_(None), free)
              .order_by(NodeCommand.id).limit(limit).with_for_update(skip_locked=True))
    rows = sorted(session.execute(
        update(NodeCommand).where(NodeCommand.id.in_(wanted.scalar_subquery()))
        .values(claimed_at=now)
        .returning(NodeCommand.id, NodeCommand.kind, NodeCommand.job_id, NodeCommand.run,
                   NodeCommand.payload)).all(), key=lambda row: row[0])
    job_ids = {job_id for _, kind, job_id, _, _ in rows if kind != "kill" and job_id}
    jobs = {job.id: job for job in session.scalars(select(Job).where(Job.id.in_(job_ids)))} \
        if job_ids else {}
    current = [row for row in rows
               if row[1] == "kill" or _is_current(jobs.get(row[2]), row[3], node, row[1])]
    stale = [row[0] for row in rows if row not in current]
    if stale:
        session.execute(update(NodeCommand).where(NodeCommand.id.in_(stale))
                        .values(done_at=now))
    orders = _launch_orders(session, node, [jobs[row[2]] for row in current
                                            if row[1] == "launch"])
    return [CommandMessage(kind, node.name, job_id, run, command_id,
                           _payload(kind, payload, orders.get(job_id)))
            for command_id, kind, job_id, run, payload in current]


def _is_current(job: Job | None, run: int, node: Node, kind: str) -> bool:
    """Whether a ``kind`` command for ``run`` of ``job`` on ``node`` still means
    something: the job runs that run there (its batch script runs on its first node;
    its steps, whose deadline a ``limit`` moves, on any of its nodes)."""
    if job is None or job.state != "RUNNING" or job.restarts != run:
        return False
    if kind in ("step", "step_cancel", "limit"):
        return job.node_id == node.id or node.name in (job.node_names or ())
    return job.node_id == node.id


def _payload(kind: str, stored: dict[str, Any], order: LaunchOrder | None) -> Payload:
    if kind == "launch":
        return order
    if kind == "signal":
        return SignalJob(int(stored["signal"]))
    if kind == "limit":
        limit, deadline = stored.get("time_limit"), stored.get("deadline")
        return LimitJob(None if limit is None else int(limit),
                        None if deadline is None else float(deadline))
    if kind == "step":
        return StepLaunch.parse(stored)
    if kind == "step_cancel":
        return StepCancel.parse(stored)
    return None


def _launch_orders(session: Session, node: Node, jobs: list[Job]) -> dict[int, LaunchOrder]:
    """The launch order of each job of ``jobs``, built from its row as it is now."""
    if not jobs:
        return {}
    placed = job_placements(session, [(j.id, j.node_id) for j in jobs])
    payloads = {p.id: p for p in session.scalars(select(JobScript).where(
        JobScript.id.in_({j.script_id for j in jobs})))}
    return {j.id: LaunchOrder(
        job_id=j.id, run=j.restarts, node=node.name, name=j.name, user=j.user_name,
        uid=j.uid, gid=j.gid, script=payloads[j.script_id].script,
        args=tuple(payloads[j.script_id].args), work_dir=j.work_dir,
        environment=dict(payloads[j.script_id].environment), output=j.output,
        error=j.error, umask=j.umask, time_limit=j.time_limit,
        warn_signal=j.warn_signal, warn_seconds=j.warn_seconds,
        warn_batch_only=bool(j.warn_batch_only),
        gpu_uuids=tuple(placed.get(j.id, (node.name, []))[1]),
        node_names=tuple(j.node_names or ()), array_job_id=j.array_job_id,
        array_task_id=j.array_task_id, array_spec=j.array_spec, cpus=j.cpus,
        mem_mb=j.mem_mb, gres_flags=j.gres_flags) for j in jobs}


def complete(session: Session, node: Node, command_id: int) -> bool:
    """The agent did command ``command_id`` (a launch: the job's supervisor runs);
    False if it was done already or is not this node's.

    The job's row is locked before the command's, the order a job's end takes (its
    row, then its commands), so an acknowledgement and the end arriving together
    never wait on each other in a cycle."""
    job_id = session.scalar(select(NodeCommand.job_id).where(
        NodeCommand.id == command_id, NodeCommand.node_id == node.id))
    if job_id is not None:
        session.execute(select(Job.id).where(Job.id == job_id).with_for_update())
    row = session.execute(
        update(NodeCommand).where(NodeCommand.id == command_id, NodeCommand.node_id == node.id,
                                  NodeCommand.done_at.is_(None))
        .values(done_at=func.now())
        .returning(NodeCommand.kind, NodeCommand.job_id, NodeCommand.run)).first()
    if row is None:
        return False
    kind, job_id, run = row
    if kind == "launch":
        session.execute(update(Job).where(Job.id == job_id, Job.restarts == run,
                                          Job.state == "RUNNING", Job.launched_at.is_(None))
                        .values(launched_at=func.now()))
    return True


def release_claims(session: Session, node_id: int) -> int:
    """Hand the node's claimed, unacknowledged commands out again (its agent started
    anew and has forgotten them); how many."""
    return rowcount(session.execute(
        update(NodeCommand).where(NodeCommand.node_id == node_id, NodeCommand.done_at.is_(None),
                                  NodeCommand.claimed_at.is_not(None))
        .values(claimed_at=None)))


def close_run(session: Session, job_ids: Iterable[int]) -> None:
    """Close the open commands of the ended runs of ``job_ids`` (all but kills, which
    are how an ended run is stopped)."""
    ids = list(job_ids)
    if ids:
        session.execute(update(NodeCommand).where(
            NodeCommand.job_id.in_(ids), NodeCommand.done_at.is_(None),
            NodeCommand.kind != "kill").values(done_at=func.now()))
