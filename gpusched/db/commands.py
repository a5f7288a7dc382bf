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

import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from psycopg.rows import namedtuple_row
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session

from gpusched.db.engine import driver, rowcount
from gpusched.db.models import Node, NodeCommand
from gpusched.db.nodes import unregistered
from gpusched.db.placements import latest_gpus_sql, latest_share_sql
from gpusched.errors import NotFound
from gpusched.messages import LaunchOrder
from gpusched.messages import NodeCommand as CommandMessage
from gpusched.messages.agent import JobNotice, LimitJob, ShareGrant, SignalJob
from gpusched.messages.containers import ContainerRequest
from gpusched.messages.jobcontrol import SuspendJob
from gpusched.messages.jobfacts import JobFacts
from gpusched.messages.mig import MigLayout
from gpusched.messages.steps import StepCancel, StepLaunch

if TYPE_CHECKING:
    from gpusched.messages.agent import Payload

RECLAIM_AFTER = 60.0  # seconds a claimed command waits for its acknowledgement
MAX_PER_POLL = 200  # commands one poll takes; the next poll takes the rest at once

# (job id, run, node id) of a command to make.
Target = tuple[int, int, int]


_ISSUE = text(
    "INSERT INTO node_commands (job_id, run, node_id, kind, payload, epoch) "
    "SELECT t.job_id, t.run, t.node_id, :kind, CAST(:payload AS jsonb),"
    " COALESCE(CAST(:epoch AS bigint), (SELECT epoch FROM leader WHERE id = 1)) "
    "FROM unnest(CAST(:jobs AS bigint[]), CAST(:runs AS integer[]), CAST(:nodes AS integer[]))"
    " WITH ORDINALITY AS t(job_id, run, node_id, n) ORDER BY t.n")


def issue(session: Session, kind: str, targets: Iterable[Target],
          payload: dict[str, Any] | None = None, epoch: int | None = None) -> int:
    """Make a ``kind`` command for each (job, run, node) of ``targets``, in that order
    (their ids too), stamped with ``epoch`` (None: the epoch in force, for commands
    users' requests make on any controller); how many were made."""
    rows = list(targets)
    if not rows:
        return 0
    session.execute(_ISSUE, {
        "kind": kind, "payload": json.dumps(payload or {}), "epoch": epoch,
        "jobs": [job_id for job_id, _, _ in rows], "runs": [run for _, run, _ in rows],
        "nodes": [node_id for _, _, node_id in rows]})
    return len(rows)


def has_open(session: Session, node_id: int) -> bool:
    """Whether ``node_id`` has commands not yet done (claimed or not)."""
    return session.scalar(select(NodeCommand.id).where(
        NodeCommand.node_id == node_id, NodeCommand.done_at.is_(None)).limit(1)) is not None


# The statements of an agent's poll and acknowledgements, the calls every job's launch
# makes: plain SQL run on the driver's connection (engine.driver; an ORM or Core query of
# the same costs several times the CPU).
_HEARTBEAT = (
    "UPDATE nodes SET last_seen = %(now)s WHERE name = %(name)s "
    "RETURNING id, state, lost_at, registered_at, reason")
_CLAIM = (
    "UPDATE node_commands SET claimed_at = %(now)s WHERE id IN ("
    " SELECT id FROM node_commands WHERE node_id = %(node)s AND done_at IS NULL"
    " AND (claimed_at IS NULL OR claimed_at < %(stale)s)"
    " ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) "
    "RETURNING id, kind, job_id, run, payload")
# A job to launch (its script read) that may hold a share of a GPU: only those pay for
# reading it.
_MAY_SHARE = "s.id IS NOT NULL AND (j.share_mode IS NOT NULL OR j.gpu_mem_mb IS NOT NULL)"
# The jobs of claimed commands; for those to launch (``launch``), their script and the GPU
# UUIDs of their latest run on the node of the batch script (placements.latest_gpus_sql):
# like Slurm's, the batch script of a multi-node job sees only its own node's GPUs.
_JOBS = (
    "SELECT j.id, j.state, j.restarts, j.node_id, j.node_names, j.name, j.user_name,"
    " j.uid, j.gid, j.work_dir, j.output, j.error, j.umask, j.time_limit, j.warn_signal,"
    " j.warn_seconds, j.warn_batch_only, j.array_job_id, j.array_task_id, j.array_spec,"
    " j.cpus, j.mem_mb, j.gres_flags, s.script, s.args, s.environment, j.container,"
    " j.partition, j.account, j.qos, j.dependency, j.gpus, j.start_time, j.open_mode,"
    " CASE WHEN s.id IS NULL THEN NULL ELSE "
    + latest_gpus_sql("j.id", "j.node_id") + " END AS gpu_uuids,"
    " j.share_mode, CASE WHEN " + _MAY_SHARE + " THEN "
    + latest_share_sql("j.id") + " END AS share,"
    # The units a GPU of its node offers: as the pass had them (core.sharing.share_nodes),
    # from the first partition by name that shares the node's GPUs.
    " CASE WHEN " + _MAY_SHARE + " THEN (SELECT p.shares FROM partitions AS p"
    "  JOIN nodes AS sn ON sn.id = j.node_id WHERE p.sharing IS NOT NULL"
    "  AND p.shares IS NOT NULL AND ('*' = ANY(p.nodes) OR sn.name = ANY(p.nodes))"
    "  ORDER BY p.name LIMIT 1) END AS share_of "
    "FROM jobs j LEFT JOIN job_scripts s ON s.id = j.script_id"
    " AND j.id = ANY(CAST(%(launch)s AS bigint[])) "
    "WHERE j.id = ANY(CAST(%(ids)s AS bigint[]))")
_CLOSE = ("UPDATE node_commands SET done_at = %(now)s"
          " WHERE id = ANY(CAST(%(ids)s AS bigint[]))")
_NODE_ID = text("SELECT id FROM nodes WHERE name = :name")
# An agent's acknowledgements, in one statement: the jobs of the node's commands named
# are locked first (``locked``, which ``done`` waits for: it joins its count), in id
# order, as a job's end locks its row before its commands, so an acknowledgement and an
# end arriving together never wait on each other in a cycle; then the commands not done
# yet are marked done, and the runs they launched get ``launched_at`` (a row a
# concurrent end changed meanwhile is checked again as it is now: EvalPlanQual).
_COMPLETE = (
    "WITH locked AS ("
    " SELECT id FROM jobs WHERE id IN (SELECT job_id FROM node_commands"
    "  WHERE id = ANY(CAST(%(ids)s AS bigint[])) AND node_id = %(node)s"
    "  AND job_id IS NOT NULL)"
    " ORDER BY id FOR UPDATE), "
    "done AS ("
    " UPDATE node_commands AS c SET done_at = now()"
    " FROM (SELECT count(*) AS n FROM locked) AS l"
    " WHERE c.id = ANY(CAST(%(ids)s AS bigint[])) AND c.node_id = %(node)s"
    " AND c.done_at IS NULL AND l.n >= 0"
    " RETURNING c.id, c.kind, c.job_id, c.run), "
    "launched AS ("
    " UPDATE jobs SET launched_at = now() FROM done"
    " WHERE done.kind = 'launch' AND jobs.id = done.job_id AND jobs.restarts = done.run"
    " AND jobs.state = 'RUNNING' AND jobs.launched_at IS NULL) "
    "SELECT id FROM done")


def poll(session: Session, name: str, registered: datetime | None, done: Iterable[int] = ()
         ) -> tuple[list[CommandMessage], datetime | None]:
    """An agent's poll for node ``name``: record that it is alive, mark the commands
    ``done`` that it did since its last poll (see complete_all), then claim its
    commands (see claim). Returns them and when the node registered; when that is not
    ``registered`` (given: the poll waited meanwhile), nothing is claimed: the poll is
    that of an agent since replaced, and what it claimed would be lost.

    A node the controller gave up on (or one DOWN for another reason) must register
    again first: NotFound says so (the transaction, rolled back, records nothing), and
    the agent's answer to NotFound is to register."""
    now = datetime.now(UTC)
    row = driver(session).execute(_HEARTBEAT, {"now": now, "name": name}).fetchone()
    if row is None:
        raise unregistered(name)
    node_id, state, lost_at, registered_at, reason = row
    if lost_at is not None or state == "DOWN":
        raise NotFound(f"node {name} is {state} ({reason or 'not registered'}): "
                       f"the agent must register again")
    if done:
        complete_all(session, node_id, done)
    if registered is not None and registered_at != registered:
        return [], registered_at
    return _claim(session, node_id, name, now, RECLAIM_AFTER, MAX_PER_POLL), registered_at


def claim(session: Session, node: Node, reclaim_after: float = RECLAIM_AFTER,
          limit: int = MAX_PER_POLL) -> list[CommandMessage]:
    """Claim ``node``'s open commands, oldest first, skipping those another transaction
    holds; close the stale ones and return the rest as messages."""
    return _claim(session, node.id, node.name, datetime.now(UTC), reclaim_after, limit)


def _claim(session: Session, node_id: int, node_name: str, now: datetime,
           reclaim_after: float, limit: int) -> list[CommandMessage]:
    conn = driver(session)
    rows = sorted(conn.execute(_CLAIM, {
        "now": now, "node": node_id, "stale": now - timedelta(seconds=reclaim_after),
        "limit": limit}).fetchall(), key=lambda row: row[0])
    if not rows:
        return []
    job_ids = list({job_id for _, kind, job_id, _, _ in rows if kind != "kill" and job_id})
    launch = [job_id for _, kind, job_id, _, _ in rows if kind == "launch" and job_id]
    jobs = {row.id: row for row in conn.cursor(row_factory=namedtuple_row).execute(
        _JOBS, {"ids": job_ids, "launch": launch})} if job_ids else {}
    current = [row for row in rows
               if row[1] in ("kill", "mig") or _is_current(jobs.get(row[2]), row[3], node_id,
                                                            node_name, row[1])]
    stale = [row[0] for row in rows if row not in current]
    if stale:
        conn.execute(_CLOSE, {"now": now, "ids": stale})
    return [CommandMessage(kind, node_name, job_id, run, command_id,
                           _payload(kind, payload, node_name, jobs.get(job_id)))
            for command_id, kind, job_id, run, payload in current]


def _is_current(job: Any, run: int, node_id: int, node_name: str, kind: str) -> bool:
    """Whether a ``kind`` command for ``run`` of ``job`` (a row of _JOBS) on the node
    still means something: the job runs that run there (its batch script runs on its
    first node; its steps, whose deadline a ``limit`` moves, on any of its nodes)."""
    if job is None or job.state != "RUNNING" or job.restarts != run:
        return False
    if kind in ("step", "step_cancel", "limit", "suspend"):
        return bool(job.node_id == node_id or node_name in (job.node_names or ()))
    return bool(job.node_id == node_id)


def _payload(kind: str, stored: dict[str, Any], node_name: str, job: Any) -> Payload:
    if kind == "launch":
        return _launch_order(job, node_name)
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
    if kind == "suspend":  # stop or continue the job here (db/jobcontrol.py)
        return SuspendJob.parse(stored)
    if kind == "notice":  # a line for the job's output (db/idle_policy.py)
        return JobNotice(str(stored["text"]))
    if kind == "mig":  # a MIG layout for one GPU (db/mig_changes.py): no job
        return MigLayout.parse(stored)  # type: ignore[return-value]
    return None


def _launch_order(j: Any, node_name: str) -> LaunchOrder:
    """The launch order of a job, from its row of _JOBS as it is now."""
    return LaunchOrder(
        job_id=j.id, run=j.restarts, node=node_name, name=j.name, user=j.user_name,
        uid=j.uid, gid=j.gid, script=j.script, args=tuple(j.args), work_dir=j.work_dir,
        environment=dict(j.environment), output=j.output, error=j.error, umask=j.umask,
        time_limit=j.time_limit, warn_signal=j.warn_signal, warn_seconds=j.warn_seconds,
        warn_batch_only=bool(j.warn_batch_only), gpu_uuids=tuple(j.gpu_uuids or ()),
        node_names=tuple(j.node_names or ()), array_job_id=j.array_job_id,
        array_task_id=j.array_task_id, array_spec=j.array_spec, cpus=j.cpus,
        mem_mb=j.mem_mb, gres_flags=j.gres_flags, open_mode=j.open_mode, share=_share(j),
        job=JobFacts(
            partition=j.partition, account=j.account, qos=j.qos, dependency=j.dependency,
            gpus=j.gpus, start_time=None if j.start_time is None
            else int(j.start_time.timestamp())),
        container=None if j.container is None else ContainerRequest.parse(j.container))


def _share(j: Any) -> ShareGrant | None:
    """The share of its GPU a job to launch holds (None: its GPUs whole), from its row of
    _JOBS: its share mode, its latest run's share [uuid, units, mem_mb], and the units
    its partition's GPUs offer. A job that asked only for GPU memory and got a share
    has it by MPS."""
    if not j.share or not j.share_of:
        return None
    uuid, units, mem = j.share
    return ShareGrant(mode=j.share_mode or "mps", gpu_uuid=uuid, units=units, of=j.share_of,
                      mem_mb=mem or 0)


def node_id(session: Session, name: str) -> int:
    """The id of registered node ``name``."""
    found = session.scalar(_NODE_ID, {"name": name})
    if found is None:
        raise unregistered(name)
    return int(found)


def complete(session: Session, node: Node, command_id: int) -> bool:
    """The agent did command ``command_id`` (a launch: the job's supervisor runs);
    False if it was done already or is not this node's."""
    return bool(complete_all(session, node.id, [command_id]))


def complete_all(session: Session, node_id: int, command_ids: Iterable[int]) -> list[int]:
    """The agent of node ``node_id`` did these commands (for a launch: the job's
    supervisor runs); those not done before and this node's, in the order given (one
    statement: _COMPLETE, which says how it orders its locks)."""
    ids = list(dict.fromkeys(command_ids))
    done = {row[0] for row in driver(session).execute(_COMPLETE, {"ids": ids, "node": node_id})}
    return [command_id for command_id in ids if command_id in done]


def release_claims(session: Session, node_id: int) -> int:
    """Hand the node's claimed, unacknowledged commands out again (its agent started
    anew and has forgotten them); how many."""
    return rowcount(session.execute(
        update(NodeCommand).where(NodeCommand.node_id == node_id, NodeCommand.done_at.is_(None),
                                  NodeCommand.claimed_at.is_not(None))
        .values(claimed_at=None)))
