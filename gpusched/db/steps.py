"""Job steps: what ``gsrun`` starts inside a running job (docs/api.md, "Steps").

A step is made under its job's row lock (``SELECT ... FOR UPDATE``), so that two steps
asked for at once get consecutive ids and never both take what one of them holds. Its
layout is worked out by gpusched.core.steps from the job's nodes, the GPUs it holds on
each and what the job's other running steps hold (a step made with ``overlap`` holds
nothing: it shares). Each of its nodes gets a ``step`` command; each reports its end
(StepEnd), and the step's state is decided once all have (``nodes_ended``).

When the job's run ends first, its running steps end with it (CANCELLED, TIMEOUT or
NODE_FAIL after the job's end) and every other node of the job gets a ``kill``; reports
its nodes send afterwards still settle the state once all are in when they say the
tasks ended on their own (exit codes, no signal). A step whose tasks die while its job
is being cancelled ends CANCELLED, as scancel's steps do.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import all_, any_, func, literal, select, update
from sqlalchemy.orm import Session

from gpusched.core import bounds
from gpusched.core import steps as layout_rules
from gpusched.core.jobcontrol import effective_limit
from gpusched.db import commands
from gpusched.db.engine import driver
from gpusched.db.jobs import Identity
from gpusched.db.models import Allocation, Gpu, Job, JobStep, Node
from gpusched.db.notify import notify_in
from gpusched.errors import (
    Conflict,
    LimitReached,
    NotFound,
    PermissionDenied,
    StepBusy,
    UsageError,
)
from gpusched.messages.agent import LimitJob
from gpusched.messages.steps import (
    StepCancel,
    StepCreated,
    StepEnd,
    StepLaunch,
    StepRequest,
    StepTask,
)

MAX_STEPS_PER_JOB = 40_000  # Slurm's MaxStepCount
ENDED_WITH_JOB = "ended with its job"

# The state a node's outcome makes, worst first (launch_failed: nothing ran there).
_OUTCOME_ORDER = ("launch_failed", "timeout", "out_of_memory", "failed", "cancelled",
                  "completed")


def _own_job(session: Session, job_id: int, who: Identity, verb: str,
             lock: bool = False) -> Job:
    """The job, if it exists and ``who`` may ``verb`` its steps (its owner or an admin)."""
    stmt = select(Job).where(Job.id == job_id)
    job = session.scalars(stmt.with_for_update() if lock else stmt).first()
    if job is None:
        raise NotFound(f"invalid job id specified: {job_id}")
    if job.uid != who.uid and not who.is_admin:
        raise PermissionDenied(f"job {job_id} belongs to {job.user_name}; you may {verb} only "
                               f"in your own jobs")
    return job


def _job_nodes(session: Session, job: Job) -> tuple[list[layout_rules.JobNode],
                                                    dict[str, str]]:
    """The job's nodes in order (the batch script's first) with the GPUs its run holds
    on each; and each node's address (its name when it registered none)."""
    names = list(job.node_names or ())
    if not names:
        batch = session.scalar(select(Node.name).where(Node.id == job.node_id))
        names = [batch] if batch else []
    gpus: dict[str, list[str]] = {name: [] for name in names}
    for node, uuid in session.execute(
            select(Node.name, Gpu.uuid).select_from(Allocation)
            .join(Gpu, Gpu.id == Allocation.gpu_id).join(Node, Node.id == Allocation.node_id)
            .where(Allocation.job_id == job.id, Allocation.released_at.is_(None))
            .order_by(Gpu.index, Gpu.uuid)):
        gpus.setdefault(node, []).append(uuid)
    addresses = {name: address or name for name, address in session.execute(
        select(Node.name, Node.address).where(Node.name.in_(names)))}
    return ([layout_rules.JobNode(name, tuple(gpus.get(name, ())), job.cpus)
             for name in names], addresses)


def _held(session: Session, job_id: int) -> dict[str, layout_rules.Held]:
    """What the job's running steps hold on each node (overlapping ones hold nothing)."""
    gpus: dict[str, set[str]] = {}
    cpus: dict[str, int] = {}
    for step_gpus, step_cpus in session.execute(
            select(JobStep.gpus, JobStep.cpus).where(
                JobStep.job_id == job_id, JobStep.state == "RUNNING",
                JobStep.overlap.is_(False))):
        for node, uuids in (step_gpus or {}).items():
            gpus.setdefault(node, set()).update(uuids)
        for node, count in (step_cpus or {}).items():
            cpus[node] = cpus.get(node, 0) + int(count)
    return {node: layout_rules.Held(frozenset(gpus.get(node, ())), cpus.get(node, 0))
            for node in set(gpus) | set(cpus)}


def _rendezvous(request: StepRequest, first_address: str, job_id: int,
                step_id: int) -> tuple[str, int]:
    """MASTER_ADDR and MASTER_PORT: gsrun's environment's when it sets them, else the
    step's first node and a port made from the job and step ids."""
    env = request.environment or {}
    addr = env.get("MASTER_ADDR") or first_address
    if len(addr) > 255:
        raise UsageError("MASTER_ADDR in the environment: expected at most 255 characters")
    port = env.get("MASTER_PORT")
    if port is None or port == "":
        return addr, layout_rules.master_port(job_id, step_id)
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65_535:
        raise UsageError(f"MASTER_PORT in the environment: expected a TCP port, got "
                         f"{port[:20]!r}")
    return addr, int(port)


def _step_name(request: StepRequest) -> str:
    name = request.name or os.path.basename(request.argv[0]) or request.argv[0]
    return name[:bounds.MAX_NAME]


def _deadline(job: Job) -> float | None:
    """When the job's time limit ends it (epoch seconds; the time it was suspended not
    counted); None: no limit."""
    began = job.launched_at or job.start_time
    if job.time_limit is None or began is None:
        return None
    return began.timestamp() + job.time_limit + job.suspended_seconds


def tell_new_limit(session: Session, job: Job) -> set[str]:
    """Running job ``job`` has a new time limit: a ``limit`` command, carrying its
    steps' new deadline, to its batch node and to each node where one of its running
    steps of this run has not ended; the names of those nodes (to wake)."""
    step_nodes: set[str] = set()
    for names, ended in session.execute(select(JobStep.node_names, JobStep.nodes_ended).where(
            JobStep.job_id == job.id, JobStep.run == job.restarts,
            JobStep.state == "RUNNING")):
        step_nodes.update(set(names) - set(ended or ()))
    node_ids = dict(session.execute(select(Node.name, Node.id).where(
        (Node.id == job.node_id) | Node.name.in_(sorted(step_nodes)))).all())
    commands.issue(session, "limit",
                   [(job.id, job.restarts, node_ids[n]) for n in sorted(node_ids)],
                   LimitJob(effective_limit(job.time_limit, job.suspended_seconds),
                            _deadline(job)).to_json())
    return set(node_ids)


def _pty_request(request: StepRequest) -> StepRequest:
    """A step with a pseudo-terminal: one task on one node unless counts are given (as
    ``srun --pty bash`` gives one shell); its terminal is its input and output."""
    if not request.pty:
        return request
    if request.output is not None or request.error is not None or request.input is not None:
        raise UsageError("pty: the terminal is the task's input and output; output, "
                         "error and input files do not apply")
    if request.nodes is None and request.ntasks is None and request.ntasks_per_node is None:
        return replace(request, nodes=1, ntasks=1)
    return request


def create_step(session: Session, job_id: int, request: StepRequest,
                who: Identity) -> tuple[StepCreated, list[str]]:
    """Store a new RUNNING step of running job ``job_id`` and a ``step`` command for
    each of its nodes; the answer gsrun gets and the nodes to wake. StepBusy when the
    job's running steps hold what it needs (nothing is stored)."""
    request = _pty_request(request)
    job = _own_job(session, job_id, who, "start steps", lock=True)
    if job.state != "RUNNING":
        raise Conflict(f"job {job_id} is {job.state}: steps run only inside a running job")
    if job.cancel_requested_at is not None:
        raise Conflict(f"job {job_id} is being stopped: no new steps")
    if job.suspended_at is not None:
        raise Conflict(f"job {job_id} is suspended: no new steps until it is resumed")
    job_nodes, addresses = _job_nodes(session, job)
    ask = layout_rules.StepAsk(
        nodes=request.nodes, ntasks=request.ntasks, ntasks_per_node=request.ntasks_per_node,
        gpus_per_task=request.gpus_per_task, cpus_per_task=request.cpus_per_task,
        exact=request.exact, overlap=request.overlap)
    try:
        placed = layout_rules.layout(job_nodes, ask, _held(session, job_id))
    except layout_rules.StepLayoutError as exc:
        raise UsageError(str(exc)) from None
    except layout_rules.StepBusy as exc:
        raise StepBusy(f"job {job_id}: {exc}") from None
    if request.pty and placed.ntasks != 1:
        raise UsageError(f"pty: a step with a pseudo-terminal runs one task (got "
                         f"{placed.ntasks})")
    last = session.scalar(select(func.max(JobStep.step_id)).where(JobStep.job_id == job_id))
    step_id = 0 if last is None else last + 1
    if step_id >= MAX_STEPS_PER_JOB or step_id > layout_rules.MAX_STEP_ID:
        raise LimitReached(f"job {job_id} has made {MAX_STEPS_PER_JOB} steps, the most a "
                           "job may make")
    master_addr, master_port = _rendezvous(request, addresses[placed.node_names[0]],
                                           job_id, step_id)
    name = _step_name(request)
    session.add(JobStep(
        job_id=job_id, step_id=step_id, run=job.restarts, name=name, state="RUNNING",
        uid=who.uid, node_names=list(placed.node_names), layout=placed.by_node(),
        ntasks=placed.ntasks, overlap=request.overlap,
        gpus={part.name: list(part.gpus) for part in placed.parts},
        cpus={part.name: part.cpus for part in placed.parts},
        start_time=datetime.now(UTC)))
    session.flush()
    node_ids = dict(session.execute(select(Node.name, Node.id).where(
        Node.name.in_(placed.node_names))).all())
    job_gpus = {node.name: node.gpus for node in job_nodes}
    for part in placed.parts:
        launch = StepLaunch(
            job_id=job_id, run=job.restarts, step_id=step_id, node=part.name,
            node_index=part.index, name=name, job_name=job.name, user=job.user_name,
            uid=job.uid, gid=job.gid, argv=request.argv, work_dir=request.work_dir,
            tasks=tuple(StepTask(t.task_id, t.local_id, t.gpus) for t in part.tasks),
            ntasks=placed.ntasks,
            node_names=placed.node_names, tasks_per_node=placed.tasks_per_node,
            master_addr=master_addr, master_port=master_port, io=request.io,
            environment=dict(request.environment or {}), umask=job.umask,
            gpu_uuids=job_gpus.get(part.name, ()), cpus=job.cpus, mem_mb=job.mem_mb,
            deadline=_deadline(job), output=request.output, error=request.error,
            input=request.input, pty=request.pty, kill_on_bad_exit=request.kill_on_bad_exit)
        commands.issue(session, "step", [(job_id, job.restarts, node_ids[part.name])],
                       launch.to_json())
    notify_in(session, *(f"node:{name}" for name in placed.node_names))
    created = StepCreated(step_id=step_id, node_names=placed.node_names,
                          layout={k: tuple(v) for k, v in placed.by_node().items()},
                          ntasks=placed.ntasks, master_addr=master_addr,
                          master_port=master_port)
    return created, list(placed.node_names)


def _step(session: Session, job_id: int, step_id: int, lock: bool = False) -> JobStep:
    stmt = select(JobStep).where(JobStep.job_id == job_id, JobStep.step_id == step_id)
    step = session.scalars(stmt.with_for_update() if lock else stmt).first()
    if step is None:
        raise NotFound(f"invalid step id specified: {job_id}.{step_id}")
    return step


def cancel_step(session: Session, job_id: int, step_id: int, who: Identity,
                bad_exit: bool = False, signum: int | None = None) -> list[str]:
    """End a running step (``bad_exit``: one of its tasks failed and gsrun -K ends the
    rest; the step ends FAILED), or only send it ``signum``; the nodes to wake."""
    job = _own_job(session, job_id, who, "cancel steps")
    step = _step(session, job_id, step_id, lock=True)
    if step.state != "RUNNING":
        raise Conflict(f"step {job_id}.{step_id} has already ended ({step.state})")
    waiting = [n for n in step.node_names if n not in step.nodes_ended]
    if signum is None:
        step.cancelled = True
        step.bad_exit = step.bad_exit or bad_exit
    node_ids = dict(session.execute(select(Node.name, Node.id).where(
        Node.name.in_(waiting))).all())
    payload = StepCancel(step_id, signum).to_json()
    commands.issue(session, "step_cancel",
                   [(job.id, step.run, node_ids[n]) for n in waiting if n in node_ids], payload)
    notify_in(session, *(f"node:{n}" for n in waiting))
    return waiting


def record_step_end(session: Session, job_id: int, step_id: int,
                    body: dict[str, Any]) -> tuple[bool, bool]:
    """Record how step ``job_id.step_id`` ended on the reporting node; once every node
    of it has reported, its final state. Returns (changed, stale): stale when no such
    step runs (or ran) on that node in that run, or the node has reported already."""
    end = StepEnd.parse(body)
    ended = (datetime.fromtimestamp(end.end_time, UTC) if end.end_time is not None
             else datetime.now(UTC))
    error = None if end.error is None else f"node {end.node}: {end.error}"
    row = session.execute(
        update(JobStep).where(
            JobStep.job_id == job_id, JobStep.step_id == step_id, JobStep.run == end.run,
            literal(end.node) == any_(JobStep.node_names),
            literal(end.node) != all_(JobStep.nodes_ended))
        .values(nodes_ended=func.array_append(JobStep.nodes_ended, end.node),
                outcomes=func.array_append(JobStep.outcomes, end.outcome),
                exit_code=func.greatest(JobStep.exit_code, end.exit_code),
                signal=func.coalesce(JobStep.signal, end.signal),
                max_rss_bytes=func.greatest(JobStep.max_rss_bytes, end.max_rss_bytes),
                cpu_usec=JobStep.cpu_usec if end.cpu_usec is None
                else func.coalesce(JobStep.cpu_usec, 0) + end.cpu_usec,
                error=func.coalesce(JobStep.error, error),
                end_time=func.greatest(JobStep.end_time, ended))
        .returning(JobStep.state, JobStep.node_names, JobStep.nodes_ended, JobStep.outcomes,
                   JobStep.cancelled, JobStep.bad_exit, JobStep.exit_code,
                   JobStep.signal)).first()
    if row is None:
        return False, True
    state, nodes, reported, outcomes, cancelled, bad_exit, exit_code, signum = row
    if len(reported) < len(nodes):
        return True, False
    final = final_state(outcomes, cancelled, bad_exit, exit_code, signum)
    error_now: Any = JobStep.error
    if state != "RUNNING":  # the job's end closed it before every node had reported
        if cancelled or final == "COMPLETED" or (final == "FAILED" and signum is None):
            # it ended on its own, or its own cancel ended it
            error_now = func.nullif(JobStep.error, ENDED_WITH_JOB)
        else:
            final = state  # the job's end stopped its tasks: the job's reason stands
    elif final in ("FAILED", "CANCELLED") and not bad_exit \
            and "launch_failed" not in outcomes and _job_stopping(session, job_id):
        final = "CANCELLED"  # its tasks died of the job's cancel (scancel ends steps so)
    session.execute(update(JobStep).where(
        JobStep.job_id == job_id, JobStep.step_id == step_id).values(
            state=final, signal=None if bad_exit and final == "FAILED" else signum,
            error=error_now))
    return True, False


def _job_stopping(session: Session, job_id: int) -> bool:
    """Whether the job is being (or was) cancelled, requeued or preempted."""
    return bool(session.scalar(select(Job.cancel_requested_at.is_not(None)).where(
        Job.id == job_id)))


def final_state(outcomes: Sequence[str], cancelled: bool, bad_exit: bool,
                exit_code: int | None, signum: int | None) -> str:
    """A step's state from its nodes' outcomes, as sacct shows it: a launch failure or
    a bad exit (gsrun -K) is FAILED, a cancel CANCELLED; else the worst node's."""
    seen = set(outcomes)
    if "launch_failed" in seen or bad_exit:
        return "FAILED"
    if cancelled:
        return "CANCELLED"
    for outcome, state in (("timeout", "TIMEOUT"), ("out_of_memory", "OUT_OF_MEMORY"),
                           ("failed", "FAILED"), ("cancelled", "CANCELLED")):
        if outcome in seen:
            return state
    return "FAILED" if (exit_code or signum) else "COMPLETED"


# The running steps of a job whose run ended end with it (end_with_job): FAILED when
# gsrun -K was ending them, NODE_FAIL when on a lost node, else the state given. Plain
# SQL built once: every job's end runs it, and for most (no steps) it changes nothing.
_END_RUNNING = (
    "UPDATE job_steps SET state = CASE WHEN bad_exit THEN 'FAILED'"
    " WHEN node_names && CAST(%(lost)s AS text[]) THEN 'NODE_FAIL' ELSE %(state)s END,"
    " end_time = now(), error = COALESCE(error, %(why)s)"
    " WHERE job_id = %(job)s AND state = 'RUNNING' RETURNING run, node_names")


def end_with_job(session: Session, job_id: int, run: int, nodes: Iterable[str],
                 job_state: str, skip: Iterable[str] = (), lost: Iterable[str] = ()
                 ) -> set[str]:
    """Run ``run`` of job ``job_id`` on ``nodes`` has ended (the job is now
    ``job_state``): its running steps end with it, and each of its nodes but ``skip``
    and ``lost`` gets a ``kill`` for that run, so that no step outlives its job. The
    nodes told to kill (already NOTIFYed)."""
    lost_nodes = sorted(set(lost))
    steps_nodes = driver(session).execute(_END_RUNNING, {
        "lost": lost_nodes, "state": "TIMEOUT" if job_state == "TIMEOUT" else "CANCELLED",
        "why": ENDED_WITH_JOB, "job": job_id}).fetchall()
    targets = set(nodes) | {n for step_run, names in steps_nodes if step_run == run
                            for n in names}
    targets -= set(skip) | set(lost_nodes)
    if not targets:
        return set()
    node_ids = dict(session.execute(select(Node.name, Node.id).where(
        Node.name.in_(targets))).all())
    commands.issue(session, "kill", [(job_id, run, node_ids[n]) for n in sorted(node_ids)])
    notify_in(session, *(f"node:{n}" for n in sorted(node_ids)))
    return set(node_ids)


def list_steps(session: Session, job_id: int) -> list[dict[str, Any]]:
    """The job's steps, oldest first (NotFound if there is no such job)."""
    if session.scalar(select(Job.id).where(Job.id == job_id)) is None:
        raise NotFound(f"invalid job id specified: {job_id}")
    return [step_view(step) for step in session.scalars(
        select(JobStep).where(JobStep.job_id == job_id).order_by(JobStep.step_id))]


def get_step(session: Session, job_id: int, step_id: int) -> dict[str, Any]:
    """One STEP object (NotFound if there is no such step)."""
    return step_view(_step(session, job_id, step_id))


def steps_of(session: Session, job_ids: Sequence[int]) -> dict[int, list[JobStep]]:
    """The steps of each of ``job_ids`` that has any, oldest first."""
    found: dict[int, list[JobStep]] = {}
    if not job_ids:
        return found
    for step in session.scalars(select(JobStep).where(JobStep.job_id.in_(list(job_ids)))
                                .order_by(JobStep.job_id, JobStep.step_id)):
        found.setdefault(step.job_id, []).append(step)
    return found


def step_view(step: JobStep, now: datetime | None = None) -> dict[str, Any]:
    """A STEP object (docs/api.md)."""
    now = now or datetime.now(UTC)
    running = step.state == "RUNNING"
    end = None if running else step.end_time
    return {
        "job_id": step.job_id, "step_id": step.step_id, "name": step.name,
        "state": step.state, "run": step.run, "uid": step.uid,
        "node_names": list(step.node_names), "layout": step.layout, "ntasks": step.ntasks,
        "gpus": step.gpus, "cpus": step.cpus, "overlap": step.overlap,
        "start_time": step.start_time.isoformat(),
        "end_time": end.isoformat() if end else None,
        "elapsed_s": max(0.0, ((end or now) - step.start_time).total_seconds()),
        "exit_code": None if running else step.exit_code,
        "signal": None if running else step.signal,
        "max_rss_bytes": step.max_rss_bytes, "cpu_usec": step.cpu_usec,
        "nodes_ended": list(step.nodes_ended), "error": step.error}
