"""Agent-facing operations: registration, heartbeats and end reports (the work agents
claim is in db/commands.py; node failure and fencing in db/node_failure.py)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import case, delete, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from gpusched.core.features import check_features
from gpusched.core.topology import LINK_KINDS
from gpusched.db import commands, mig_changes, node_drain, steps
from gpusched.db.containers import registered_runtime
from gpusched.db.engine import driver, rowcount
from gpusched.db.health import may_requeue
from gpusched.db.models import Gpu, GpuLink, Job, Node
from gpusched.db.nodes import unregistered
from gpusched.errors import NotFound, UsageError
from gpusched.messages import JobEnd, NodeHealth
from gpusched.messages.steprequest import MAX_HOST

# The state each outcome of gpusched.messages.OUTCOMES ends a job in.
OUTCOME_STATES = {
    "completed": "COMPLETED",
    "failed": "FAILED",
    "launch_failed": "FAILED",
    "cancelled": "CANCELLED",
    "timeout": "TIMEOUT",
    "out_of_memory": "OUT_OF_MEMORY",
    "prolog_failed": "PENDING",  # requeued: nothing of it ran (record_run_end)
    "not_started": "PENDING",  # requeued: nothing of it ran (record_run_end)
}
# Outcomes of a run of which nothing ran: the job goes back to the queue.
_NOTHING_RAN = ("prolog_failed", "not_started")


LAUNCH_FAILED_REASON = "LaunchFailed"
MAX_ENFORCEMENT = 256  # characters of how a node confines its jobs (or why it cannot)
_HOST = re.compile(r"[A-Za-z0-9._:\-\[\]%]+")  # a host name or an IPv4/IPv6 address


def registered_node(session: Session, name: str) -> Node:
    node = session.scalars(select(Node).where(Node.name == name)).first()
    if node is None:
        raise unregistered(name)
    return node


def register_node(session: Session, body: dict[str, Any]) -> Node:
    """Create or refresh a node and its GPU inventory; the node becomes UP (a drained
    one stays DRAIN) and is no longer lost; commands it claimed before are handed out
    again, its agent having started anew. ``health``, where the node has a health check,
    is its latest result (a NodeHealth), applied in the same transaction: a node whose
    check fails is never UP for a moment in between."""
    name, gpus, uid = body.get("node"), body.get("gpus"), body.get("uid")
    if not isinstance(name, str) or not name:
        raise UsageError("node: expected the node name")
    health = None if body.get("health") is None else NodeHealth.parse(body["health"])
    if health is not None and health.node != name:
        raise UsageError(f"health: the report is for node {health.node}, not {name}")
    if not isinstance(gpus, list) or not isinstance(uid, int):
        raise UsageError("gpus: expected a list of GPUs; uid: expected the agent's uid")
    now = datetime.now(UTC)
    cpus, memory_mb, block = body.get("cpus", 0), body.get("memory_mb", 0), body.get("block")
    if not isinstance(cpus, int) or not isinstance(memory_mb, int) or cpus < 0 or memory_mb < 0:
        raise UsageError("cpus, memory_mb: expected whole numbers, 0 or more")
    if block is not None and not isinstance(block, str):
        raise UsageError("block: expected a topology block name")
    enforced, enforcement = _enforcement(body)
    address = _address(body.get("address"))
    values: dict[str, Any] = {"state": "UP", "reason": None, "run_uid": None if uid == 0 else uid,
                              "registered_at": now, "last_seen": now, "cpus": cpus,
                              "memory_mb": memory_mb, "block": block, "lost_at": None,
                              "address": address, "container_runtime": registered_runtime(body),
                              "enforced": enforced, "enforcement": enforcement,
                              "drained_by": None,
                              # From its GPUs (absent: none); its admin's are kept apart.
                              "features": list(check_features(body.get("features", []),
                                                               "features"))}
    stmt = insert(Node).values(name=name, **values)
    # A drained node stays drained, whatever its agent does, until an admin resumes it
    # (or, for a drain its health check made, until a check passes).
    drained = Node.state == "DRAIN"
    kept = {**values, "state": case((drained, "DRAIN"), else_="UP"),
            "reason": case((drained, Node.reason), else_=None),
            "drained_by": case((drained, Node.drained_by), else_=None)}
    session.execute(stmt.on_conflict_do_update(index_elements=[Node.name], set_=kept))
    node = registered_node(session, name)
    if health is not None:
        node_drain.record_health(session, node, health)
    commands.release_claims(session, node.id)
    mig_changes.note_layouts(session, node.id, gpus)
    seen: list[str] = []
    for gpu in gpus:
        if not isinstance(gpu, dict) or not isinstance(gpu.get("uuid"), str):
            raise UsageError("gpus: each GPU needs at least a uuid")
        row = {
            "node_id": node.id, "index": int(gpu.get("index", 0)), "uuid": gpu["uuid"],
            "name": str(gpu.get("name", "")), "memory_mb": int(gpu.get("memory_mb", 0)),
            "pci_bus_id": str(gpu.get("pci_bus_id", "")), "present": True,
            "gpu_type": str(gpu.get("type") or "gpu"),
            "mig_profile": gpu.get("mig_profile") or None,
        }
        session.execute(insert(Gpu).values(**row).on_conflict_do_update(
            index_elements=[Gpu.uuid], set_=row))
        seen.append(gpu["uuid"])
    _register_slices_and_links(session, node, gpus, body.get("links") or [])
    # A GPU that vanished keeps its row (allocations refer to it) but is no longer offered.
    session.execute(update(Gpu).where(Gpu.node_id == node.id, Gpu.uuid.not_in(seen))
                    .values(present=False))
    return node


def _address(value: object) -> str | None:
    """Where other nodes and clients reach the node: an IP address or host name of at
    most MAX_HOST characters (absent: its name is used)."""
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_HOST \
            or not _HOST.fullmatch(value):
        raise UsageError(f"address: expected an IP address or host name of at most "
                         f"{MAX_HOST} characters, got {str(value)[:64]!r}")
    return value


def _enforcement(body: dict[str, Any]) -> tuple[bool, str | None]:
    """Whether the agent confines jobs in cgroups, and how (or why not): ``enforced``
    true or false (absent: false), ``enforcement`` up to MAX_ENFORCEMENT printable
    characters (absent: none)."""
    enforced, how = body.get("enforced", False), body.get("enforcement")
    if not isinstance(enforced, bool):
        raise UsageError(f"enforced: expected true or false, got {type(enforced).__name__}")
    if how is not None and (not isinstance(how, str) or len(how) > MAX_ENFORCEMENT
                            or not how.isprintable()):
        raise UsageError(f"enforcement: expected at most {MAX_ENFORCEMENT} printable "
                         "characters")
    return enforced, how


def _register_slices_and_links(session: Session, node: Node, gpus: list[dict[str, Any]],
                               links: list[Any]) -> None:
    """MIG slices point at their parent GPU; the node's GPU links are replaced."""
    ids = dict(session.execute(select(Gpu.index, Gpu.id).where(
        Gpu.node_id == node.id, Gpu.uuid.in_([g["uuid"] for g in gpus]))).all())
    for gpu in gpus:
        parent = gpu.get("parent")
        if parent is not None and parent not in ids:
            raise UsageError(f"gpus: MIG slice {gpu['uuid']} names parent GPU {parent}, "
                             f"which this node does not have")
        session.execute(update(Gpu).where(Gpu.uuid == gpu["uuid"])
                        .values(parent_id=ids.get(parent) if parent is not None else None))
    session.execute(delete(GpuLink).where(GpuLink.gpu_a.in_(list(ids.values()))))
    rows = []
    for link in links:
        if not isinstance(link, dict) or link.get("a") not in ids or link.get("b") not in ids \
                or link.get("kind") not in LINK_KINDS or link["a"] == link["b"]:
            raise UsageError("links: expected {a, b, kind, nvlinks} between GPUs of this node")
        a, b = sorted((ids[link["a"]], ids[link["b"]]))
        rows.append({"gpu_a": a, "gpu_b": b, "kind": link["kind"],
                     "nvlinks": int(link.get("nvlinks") or 0)})
    if rows:
        session.execute(insert(GpuLink).values(rows).on_conflict_do_nothing())


def heartbeat(session: Session, name: str) -> Node:
    """Record that the node's agent is alive. A node the controller gave up on (or one
    DOWN for another reason) must register again first: NotFound says so, and the
    agent's answer to NotFound is to register."""
    node = registered_node(session, name)
    if node.lost_at is not None or node.state == "DOWN":
        raise NotFound(f"node {name} is {node.state} ({node.reason or 'not registered'}): "
                       f"the agent must register again")
    node.last_seen = datetime.now(UTC)
    return node


def requeued(error_message: str | None) -> dict[str, Any]:
    """The columns that put a running job back in the queue with its submit time, as
    its next run (one restart more)."""
    return {"state": "PENDING", "reason": "None", "node_id": None, "start_time": None,
            "launched_at": None, "cancel_requested_at": None, "gpu_failure": None,
            "preempted_at": None, "preempt_mode": None, "preempted_by": None,
            "node_names": None, "start_kind": None, "error_message": error_message,
            "idle_since": None, "idle": False, "idle_warned_at": None,  # the run's own
            "restarts": Job.restarts + 1}


def record_end(session: Session, job_id: int, body: dict[str, Any]) -> bool:
    """Record how a job's run ended and release its GPUs; False if already recorded or
    for a run the controller has ended (see record_run_end)."""
    return record_run_end(session, job_id, body)[0]


# The end of a job's current run on a node that is neither stopping for a failed GPU
# nor being preempted (the most common end by far), recorded in one statement: the
# node's id, and the job's nodes and kind when its row changed (NULL: it did not, and
# record_run_end works the end out from the whole row instead). Plain SQL built once.
_PLAIN_END = (
    "WITH node AS (SELECT id FROM nodes WHERE name = %(node)s), ended AS ("
    " UPDATE jobs SET state = CASE WHEN jobs.cancel_requested_at IS NOT NULL"
    "  THEN CAST(%(stopped)s AS text)"
    "  WHEN %(may_be_late)s AND jobs.time_limit IS NOT NULL AND jobs.suspended_at IS NULL"
    "  AND jobs.start_time + make_interval(secs => jobs.time_limit + jobs.suspended_seconds)"
    "  <= %(end_time)s THEN 'TIMEOUT' ELSE CAST(%(state)s AS text) END,"
    " end_time = %(end_time)s,"
    " exit_code = %(exit_code)s, signal = %(signal)s, error_message = %(error)s,"
    " reason = COALESCE(%(reason)s, jobs.reason),"
    " max_rss_bytes = CASE WHEN %(measured)s THEN CAST(%(max_rss_bytes)s AS bigint)"
    "  ELSE jobs.max_rss_bytes END,"
    " cpu_usec = CASE WHEN %(measured)s THEN CAST(%(cpu_usec)s AS bigint)"
    "  ELSE jobs.cpu_usec END"
    " FROM node WHERE jobs.id = %(job)s AND jobs.node_id = node.id"
    " AND jobs.state = 'RUNNING' AND jobs.restarts = %(run)s"
    " AND jobs.gpu_failure IS NULL AND jobs.preempted_at IS NULL"
    " RETURNING jobs.node_names, jobs.interactive, jobs.state) "
    "SELECT node.id, ended.interactive, ended.node_names, ended.state"
    " FROM node LEFT JOIN ended ON true")
# A run of a job has ended: its GPUs are freed and its open commands closed, all but
# kills (how an ended run is stopped); one statement.
_RELEASE = (
    "WITH freed AS (UPDATE allocations SET released_at = %(now)s"
    " WHERE job_id = %(job)s AND released_at IS NULL) "
    "UPDATE node_commands SET done_at = now()"
    " WHERE job_id = %(job)s AND done_at IS NULL AND kind <> 'kill'")


def record_run_end(session: Session, job_id: int, body: dict[str, Any]) -> tuple[bool, bool]:
    """Record how a job's run ended and release its GPUs. Returns (changed, stale):
    not changed if already recorded; stale when the report is for a run that is not
    the job's current one on that node (the controller ended it: ignored).

    What the run's cgroup measured is kept with the job. A run whose prolog failed
    never started: the job goes back to the queue (unless it was being cancelled) and
    the node is drained; an epilog's failure drains the node, whatever the end.

    ``body`` is a JobEnd report (gpusched.messages), refused whole when any field is
    out of its bounds.

    The job's row is locked (by its UPDATE) before its allocations, commands and steps."""
    end = JobEnd.parse(body)
    if end.run is None or end.outcome in _NOTHING_RAN \
            or (Job, (job_id,), None) in session.identity_map:
        # An end for whatever run is current, one that requeues, or a job this
        # session holds (the ORM keeps it in step): the whole row decides.
        return _record_from_row(session, job_id, end)
    ended = (datetime.fromtimestamp(end.end_time, UTC) if end.end_time is not None
             else datetime.now(UTC))
    measured = end.max_rss_bytes is not None or end.cpu_usec is not None
    state = OUTCOME_STATES[end.outcome]
    row = driver(session).execute(_PLAIN_END, {
        "node": end.node, "job": job_id, "run": end.run, "state": state,
        "may_be_late": end.outcome == "failed",
        "stopped": stopped_state(end.outcome), "end_time": ended,
        "exit_code": end.exit_code, "signal": end.signal, "error": end.error,
        "reason": LAUNCH_FAILED_REASON if end.outcome == "launch_failed" else None,
        "measured": measured, "max_rss_bytes": end.max_rss_bytes,
        "cpu_usec": end.cpu_usec}).fetchone()
    if row is None:
        raise unregistered(end.node)
    node_id, interactive, node_names, state = row
    if interactive is None:  # not a plain end of its current run there
        return _record_from_row(session, job_id, end)
    _released(session, job_id, end.run, tuple(node_names or (end.node,)), state,
              () if interactive else (end.node,))
    _drain_after_epilog(session, node_id, end)
    return True, False


def _record_from_row(session: Session, job_id: int, end: JobEnd) -> tuple[bool, bool]:
    """record_run_end, worked out from the job's whole row."""
    node = registered_node(session, end.node)
    job = session.get(Job, job_id)
    if job is None or (end.run is not None and job.restarts != end.run) \
            or job.node_id != node.id:
        _drain_after_epilog(session, node.id, end)
        return False, True
    run, job_nodes = job.restarts, tuple(job.node_names or (node.name,))
    values = _end_values(session, job, node, end)
    if end.max_rss_bytes is not None or end.cpu_usec is not None:
        values.update(max_rss_bytes=end.max_rss_bytes, cpu_usec=end.cpu_usec)
    changed = rowcount(session.execute(
        update(Job).where(Job.id == job_id, Job.node_id == node.id, Job.state == "RUNNING",
                          Job.restarts == job.restarts)
        .values(**values)
    ))
    if changed:
        _released(session, job_id, run, job_nodes, values["state"],
                  () if job.interactive else (node.name,))
        if end.outcome == "prolog_failed":
            node_drain.drain_for_site_program(
                session, node.id, node_drain.drain_reason(end.error, "prolog failed"))
        _drain_after_epilog(session, node.id, end)
    return bool(changed), False


def stopped_state(outcome: str) -> str:
    """The state a run ends in, reported ``outcome``, when it was asked to stop (gcancel,
    gcancel --signal KILL): a run killed (or failing) on its way out is CANCELLED, as
    Slurm's is; a time limit or an out-of-memory kill that came first stays what it is."""
    return "CANCELLED" if outcome == "failed" else OUTCOME_STATES[outcome]


def _released(session: Session, job_id: int, run: int, job_nodes: tuple[str, ...],
              state: str, skip: tuple[str, ...]) -> None:
    """Run ``run`` of the job, on ``job_nodes``, has ended ``state``: its GPUs are
    released and its steps end with it. Its batch node's agent ends the job's steps
    there itself (``skip``); an allocation has no batch run there (this is the answer
    to its cancel), so that node is told too."""
    release_job(session, job_id)
    steps.end_with_job(session, job_id, run, job_nodes, state, skip=skip)


def _end_values(session: Session, job: Job, node: Node, end: JobEnd) -> dict[str, Any]:
    """The columns the end of ``job``'s current run sets."""
    ended = (datetime.fromtimestamp(end.end_time, UTC) if end.end_time is not None
             else datetime.now(UTC))
    failure = job.gpu_failure
    requeueing = failure is not None or (job.preempted_at is not None
                                         and job.preempt_mode == "requeue")
    if end.outcome in _NOTHING_RAN and (job.cancel_requested_at is None or requeueing):
        # Nothing of it ran: back in the queue with its submit time, one restart more;
        # not a failure, so jobs depending on it wait on.
        why = (node_drain.drain_reason(end.error, "prolog failed")
               if end.outcome == "prolog_failed" else end.error or "its launch was lost")
        return requeued(f"requeued: {why} (node {node.name})")
    if failure is not None and may_requeue(session, job):
        # Its GPU failed: back in the queue with its submit time, one restart more.
        return requeued(f"requeued: {failure}")
    if failure is not None:
        return {"state": "FAILED", "end_time": ended, "exit_code": end.exit_code,
                "signal": end.signal, "error_message": failure}
    if job.preempted_at is not None and job.preempt_mode == "requeue" and not job.interactive:
        # Preempted to requeue: back in the queue with its submit time, one restart more
        # (an allocation's client waits on this run: it ends instead).
        return requeued(job.error_message)
    if job.cancel_requested_at is not None:
        state = stopped_state(end.outcome)
    elif end.outcome == "failed" and past_limit(job, ended):
        state = "TIMEOUT"
    else:
        state = OUTCOME_STATES[end.outcome]
    values: dict[str, Any] = {"state": state, "end_time": ended,
                              "exit_code": end.exit_code, "signal": end.signal,
                              "error_message": end.error}
    if end.outcome == "launch_failed":  # nothing of it ran: say so where users look
        values["reason"] = LAUNCH_FAILED_REASON
    if end.outcome in _NOTHING_RAN:  # being cancelled when nothing of it ran
        values["state"] = "CANCELLED"
    if job.preempted_at is not None:
        values.update(state="CANCELLED", error_message=f"preempted by job {job.preempted_by}")
    return values


def past_limit(job: Job, when: datetime) -> bool:
    """Whether ``job``'s run had reached its time limit at ``when`` (the time it was
    suspended not counted). A run that fails then is recorded TIMEOUT, as a limit that
    ends it is: with the limit lowered below what the job has run, its nodes act on the
    change at moments apart, and a task killed on one node can make the batch script fail
    before the timeout reaches the script's own node."""
    return (job.time_limit is not None and job.suspended_at is None
            and job.start_time is not None
            and job.start_time + timedelta(seconds=job.time_limit + job.suspended_seconds)
            <= when)


def _drain_after_epilog(session: Session, node_id: int, end: JobEnd) -> None:
    """The node's epilog failed after the run: drain it with the epilog's reason."""
    if end.epilog_error is not None:
        node_drain.drain_for_site_program(
            session, node_id, node_drain.drain_reason(end.epilog_error, "epilog failed"))


def release_job(session: Session, job_id: int) -> None:
    """A run of the job has ended: its GPUs are free and its open commands moot."""
    driver(session).execute(_RELEASE, {"now": datetime.now(UTC), "job": job_id})

