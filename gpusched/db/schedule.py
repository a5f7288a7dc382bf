"""The database side of a scheduling pass: load a Snapshot in bulk, apply a Plan."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from sqlalchemy import Table, bindparam, insert, or_, select, text, update
from sqlalchemy import case as sql_case
from sqlalchemy.orm import Session

from gpusched.core.arrays import drop_first
from gpusched.core.dependency import dependency_clauses
from gpusched.core.model import (
    GpuView,
    JobState,
    NodeState,
    NodeView,
    PendingJob,
    Plan,
    RunningJob,
    Snapshot,
    Start,
)
from gpusched.core.topology import link_rank
from gpusched.db import commands
from gpusched.db.admincache import AdminCache, load_admin_tables
from gpusched.db.engine import rowcount
from gpusched.db.leadership import check_epoch
from gpusched.db.models import (
    Allocation,
    FairShareUsage,
    Gpu,
    GpuLink,
    Job,
    Node,
)
from gpusched.db.pending_rows import PendingRows, read_pending


def _nodes(session: Session) -> tuple[tuple[NodeView, ...], dict[str, int]]:
    """Nodes with their GPUs and MIG slices in index order, and node ids by name."""
    node_rows = session.execute(select(Node.id, Node.name, Node.state, Node.run_uid, Node.cpus,
                                       Node.memory_mb, Node.block).order_by(Node.name)).all()
    rows = session.execute(
        select(Gpu.id, Gpu.node_id, Gpu.index, Gpu.uuid, Gpu.healthy, Gpu.gpu_type,
               Gpu.mig_profile, Gpu.parent_id).where(Gpu.present)).all()
    index_of = {gpu_id: index for gpu_id, _, index, *_ in rows}
    parents = {parent for *_, parent in rows if parent is not None}
    gpus: dict[int, list[GpuView]] = {}
    for gpu_id, node_id, index, uuid, healthy, gpu_type, profile, parent in rows:
        gpus.setdefault(node_id, []).append(GpuView(
            uuid, index, healthy, gpu_type or "gpu", profile,
            index_of.get(parent) if parent is not None else None, gpu_id in parents))
    links: dict[int, dict[tuple[int, int], int]] = {}
    for node_id, a, b, kind, nvlinks in session.execute(
            select(Gpu.node_id, GpuLink.gpu_a, GpuLink.gpu_b, GpuLink.kind, GpuLink.nvlinks)
            .join(Gpu, Gpu.id == GpuLink.gpu_a)):
        if a in index_of and b in index_of:
            pair = sorted((index_of[a], index_of[b]))
            links.setdefault(node_id, {})[(pair[0], pair[1])] = link_rank(kind, nvlinks)
    nodes = tuple(
        NodeView(name, NodeState(state), tuple(sorted(gpus.get(nid, []), key=lambda g: g.index)),
                 run_uid, cpus, memory_mb, block, links.get(nid, {}))
        for nid, name, state, run_uid, cpus, memory_mb, block in node_rows
    )
    return nodes, {name: nid for nid, name, *_ in node_rows}


def _running(session: Session, grace: float) -> tuple[tuple[RunningJob, ...], frozenset[tuple[str, str]]]:
    """Running jobs with their GPUs, and the (user, name) pairs singleton checks."""
    gpus_of: dict[int, list[str]] = {}
    for job_id, uuid in session.execute(
        select(Allocation.job_id, Gpu.uuid).join(Gpu, Gpu.id == Allocation.gpu_id)
        .where(Allocation.released_at.is_(None)).order_by(Allocation.job_id, Gpu.index)
    ):
        gpus_of.setdefault(job_id, []).append(uuid)
    # From the jobs table, not the allocations: a job without GPUs counts toward job limits.
    rows = session.execute(
        select(Job.id, Node.name, Job.user_name, Job.account, Job.qos, Job.name, Job.array_job_id,
               Job.start_time, Job.time_limit, Job.cpus, Job.mem_mb, Job.node_names,
               Job.preempted_at, Job.exclusive)
        .join(Node, Node.id == Job.node_id).where(Job.state == "RUNNING")).all()

    def ends(start: datetime | None, limit: int | None, preempted: datetime | None) -> float | None:
        end = start.timestamp() + limit if start is not None and limit else None
        if preempted is not None:  # stopping: gone once the grace time is over
            stop = preempted.timestamp() + grace
            end = stop if end is None else min(end, stop)
        return end

    running = tuple(
        RunningJob(job_id, node, tuple(gpus_of.get(job_id, ())), user, account, qos, array_job,
                   ends(start, limit, preempted), cpus, mem, tuple(names or ()),
                   start.timestamp() if start else None, preempted is not None, exclusive)
        for job_id, node, user, account, qos, _, array_job, start, limit, cpus, mem, names,
        preempted, exclusive in rows)
    return running, frozenset((row[2], row[5]) for row in rows)


def _dependency_states(session: Session, pending: tuple[PendingJob, ...]) -> dict[int, JobState]:
    """The state of each job a dependency names; for an array, of all its tasks together."""
    named = {j for job in pending if job.dependency for c in dependency_clauses(job.dependency)
             for j in c.job_ids}
    if not named:
        return {}
    states: dict[int, list[JobState]] = {}
    for job_id, array_job, state in session.execute(
            select(Job.id, Job.array_job_id, Job.state)
            .where(or_(Job.id.in_(named), Job.array_job_id.in_(named)))):
        key = array_job if array_job in named else job_id
        states.setdefault(key, []).append(JobState(state))
    return {job_id: array_state(found) for job_id, found in states.items()}


def array_state(states: list[JobState]) -> JobState:
    """One state for a group of tasks: running until all end, then the worst ending."""
    if any(s is JobState.RUNNING for s in states):
        return JobState.RUNNING
    if any(not s.terminal for s in states):
        return JobState.PENDING
    return next((s for s in states if s is not JobState.COMPLETED), JobState.COMPLETED)


def load_snapshot(session: Session, preempt_grace: float = 30.0,
                  admin: AdminCache | None = None,
                  pending_rows: PendingRows | None = None) -> tuple[Snapshot, dict[str, int]]:
    """Everything a pass needs, in a handful of queries; also node ids by name.

    A running job being preempted counts as ending ``preempt_grace`` seconds after it
    was told to stop. The admin-configured tables come from ``admin`` when given (read
    only when they may have changed), else are read here; the pending jobs likewise
    from ``pending_rows`` (only rows changed since its last read are read in full).
    """
    nodes, node_ids = _nodes(session)
    pending = pending_rows.read(session) if pending_rows is not None else read_pending(session)
    running, running_names = _running(session, preempt_grace)
    tables = admin.tables(session) if admin is not None else load_admin_tables(session)
    snapshot = Snapshot(
        nodes=nodes, partitions=tables.partitions_over(tuple(node_ids)), pending=pending,
        running=running, accounts=tables.accounts, user_shares=tables.user_shares,
        usage={(u, a): value for u, a, value in session.execute(
            select(FairShareUsage.user_name, FairShareUsage.account, FairShareUsage.usage))},
        qos_priority=tables.qos_priority, qos_limits=tables.qos_limits,
        qos_preempt=tables.qos_preempt,
        job_states=_dependency_states(session, pending),
        running_names=running_names,
    )
    return snapshot, node_ids


# What a task split off an array's record takes from it (the rest is the task's own).
_TASK_COPIES = ("name", "uid", "gid", "user_name", "partition", "account", "qos", "begin_time",
                "dependency", "gpus", "time_limit", "submit_time", "script_id", "work_dir",
                "output", "error", "array_job_id", "array_spec",
                "array_max_running", "gpu_types", "nodes", "cpus", "mem_mb", "nodelist",
                "exclude_nodes", "warn_signal", "warn_seconds", "warn_batch_only",
                "admin_priority", "exclusive", "umask", "gres_flags", "requeue")
_SPLIT_TASKS = text(
    f"INSERT INTO jobs ({', '.join(_TASK_COPIES)}, array_task_id, node_id, start_kind, state, "
    f"reason, start_time) SELECT {', '.join('j.' + c for c in _TASK_COPIES)}, t.task, t.node, "
    "t.kind, 'RUNNING', 'None', :now FROM jobs AS j, "
    "unnest(CAST(:tasks AS integer[]), CAST(:nodes AS integer[]), CAST(:kinds AS text[])) "
    "AS t(task, node, kind) WHERE j.id = :record RETURNING id, array_task_id"
)


def _started(start: Start, node_ids: dict[str, int], now: datetime) -> dict[str, object]:
    """The columns a start sets."""
    return {"state": "RUNNING", "reason": "None", "start_time": now,
            "node_id": node_ids[start.node], "start_kind": start.kind.value,
            "expected_start": None, "node_names": list(start.nodes) if start.nodes else None,
            # An allocation's client has the grace from its start to say it is there.
            "client_seen": sql_case((Job.interactive, now), else_=Job.client_seen)}


# The starts of whole jobs in one guarded UPDATE: each row changes only if it is still
# PENDING, and RETURNING names those that did, with what their launch needs.
_START_JOBS = text(
    "UPDATE jobs SET state = 'RUNNING', reason = 'None', start_time = :now, "
    "node_id = t.node, start_kind = t.kind, expected_start = NULL, "
    "node_names = CASE WHEN t.names IS NULL THEN NULL "
    "ELSE ARRAY(SELECT jsonb_array_elements_text(t.names)) END, "
    # An allocation's client has the grace from its start to say it is there.
    "client_seen = CASE WHEN jobs.interactive THEN :now ELSE jobs.client_seen END "
    "FROM unnest(CAST(:ids AS integer[]), CAST(:nodes AS integer[]), CAST(:kinds AS text[]), "
    "CAST(:names AS jsonb[])) AS t(id, node, kind, names) "
    "WHERE jobs.id = t.id AND jobs.state = 'PENDING' "
    "RETURNING jobs.id, jobs.restarts, jobs.interactive"
)


def _start_jobs(session: Session, starts: list[Start], node_ids: dict[str, int],
                now: datetime) -> dict[int, tuple[int, bool]]:
    """Start whole jobs (not array tasks) that are still PENDING; for each started, its
    restart count and whether it is an allocation."""
    if not starts:
        return {}
    rows = session.execute(_START_JOBS, {
        "now": now, "ids": [start.job_id for start in starts],
        "nodes": [node_ids[start.node] for start in starts],
        "kinds": [start.kind.value for start in starts],
        "names": [json.dumps(list(start.nodes)) if start.nodes else None for start in starts],
    }).all()
    return {job_id: (restarts, interactive) for job_id, restarts, interactive in rows}


def _start_tasks(session: Session, record: PendingJob, starts: list[Start],
                 node_ids: dict[str, int], now: datetime) -> dict[int, Start]:
    """Start tasks of an array: split them off its pending record; started rows by job id.

    The record's task text is compared and swapped, so a cancel or a change since the
    snapshot makes this pass start none of its tasks. When the last pending task
    starts, the record itself becomes that task.
    """
    assert record.array_tasks is not None
    remaining = drop_first(record.array_tasks, len(starts))
    last = starts[-1] if remaining is None else None
    values: dict[str, object] = {"array_tasks": remaining}
    if last is not None:
        values.update(array_task_id=last.array_task_id, **_started(last, node_ids, now))
    swapped = rowcount(session.execute(
        update(Job).where(Job.id == record.job_id, Job.state == "PENDING",
                          Job.array_tasks == record.array_tasks).values(**values)))
    if not swapped:
        return {}
    started = {record.job_id: last} if last is not None else {}
    split = starts[:-1] if last is not None else starts
    if split:
        by_task = {start.array_task_id: start for start in split}
        for job_id, task in session.execute(_SPLIT_TASKS, {
                "now": now, "record": record.job_id, "tasks": list(by_task),
                "nodes": [node_ids[start.node] for start in split],
                "kinds": [start.kind.value for start in split]}):
            started[job_id] = by_task[task]
    return started


def apply_plan(session: Session, snapshot: Snapshot, plan: Plan,
               node_ids: dict[str, int], epoch: int | None = None) -> set[str]:
    """Write the plan with guarded UPDATEs and the node commands it makes (a launch
    for each started job, a cancel for each job preempted), stamped with ``epoch``;
    returns the nodes that got commands.

    With an ``epoch`` (the leader's), the leader row is held first and the plan is
    refused (NotLeader, nothing written) unless that epoch is still the current one.
    A start whose job is no longer PENDING (cancelled since the snapshot) is skipped,
    and so is one on a node no longer UP (given up, drained since: the snapshot is read
    in several statements, so it may have seen the node before and the job after); the
    nodes it starts jobs on are held (FOR SHARE) until the commit, so that none is given
    up meanwhile. The partial unique index on allocations turns any double allocation
    into an error that rolls the whole pass back.
    """
    if epoch is not None:
        check_epoch(session, epoch)
    now = datetime.now(UTC)
    started: dict[int, Start] = {}
    tasks_of: dict[int, list[Start]] = {}
    usable = _usable_nodes(session, plan.starts, node_ids)
    refused = {start for start in plan.starts
               if not usable.issuperset(start.nodes or (start.node,))}
    # The tasks an array starts in one pass are the first of its list: all or none.
    held_back = {start.job_id for start in refused if start.array_task_id is not None}
    whole: list[Start] = []
    for start in plan.starts:
        if start in refused or start.job_id in held_back:
            continue
        if start.array_task_id is not None:
            tasks_of.setdefault(start.job_id, []).append(start)
        else:
            whole.append(start)
    whole_started = _start_jobs(session, whole, node_ids, now)
    started.update((start.job_id, start) for start in whole if start.job_id in whole_started)
    if tasks_of:
        records = {job.job_id: job for job in snapshot.pending if job.job_id in tasks_of}
        for record_id, starts in tasks_of.items():
            started.update(_start_tasks(session, records[record_id], starts, node_ids, now))
    gpu_ids = {uuid: (gpu_id, node_id) for uuid, gpu_id, node_id in session.execute(
        select(Gpu.uuid, Gpu.id, Gpu.node_id).where(
            Gpu.uuid.in_([u for start in started.values() for u in start.gpu_uuids])))
    } if started else {}
    allocations = [{"job_id": job_id, "gpu_id": gpu_ids[u][0], "node_id": gpu_ids[u][1],
                    "allocated_at": now}
                   for job_id, start in started.items() for u in start.gpu_uuids]
    if allocations:
        session.execute(insert(Allocation), allocations)
    _update_pending(session, snapshot, plan)
    if started:
        # Its batch script runs on its first node (the start's node), as Slurm's does;
        # an allocation (interactive) launches nothing: its client runs steps on it.
        runs = {job_id: restarts for job_id, (restarts, interactive) in whole_started.items()
                if not interactive}
        tasks = [job_id for job_id in started if job_id not in whole_started]
        if tasks:
            runs.update(session.execute(select(Job.id, Job.restarts).where(
                Job.id.in_(tasks), Job.interactive.is_(False))).all())
        commands.issue(session, "launch", [
            (job_id, runs[job_id], node_ids[start.node]) for job_id, start in started.items()
            if job_id in runs], epoch=epoch)
    woken = {start.node for start in started.values()}
    for preemption in plan.preemptions:
        stopping = session.execute(
            update(Job).where(Job.id == preemption.job_id, Job.state == "RUNNING",
                              Job.cancel_requested_at.is_(None))
            .values(cancel_requested_at=now, preempted_at=now, preempt_mode=preemption.mode,
                    preempted_by=preemption.by)
            .returning(Job.id, Job.restarts, Job.node_id)).all()
        targets = [(job_id, run, node_id) for job_id, run, node_id in stopping
                   if node_id is not None]
        commands.issue(session, "cancel", targets, epoch=epoch)
        woken.update(name for name, node_id in node_ids.items()
                     if node_id in {t[2] for t in targets})
    return woken


def _usable_nodes(session: Session, starts: tuple[Start, ...], node_ids: dict[str, int]
                  ) -> set[str]:
    """The nodes of ``starts`` that are UP and not given up, their rows held FOR SHARE
    for the rest of the transaction."""
    names = {name for start in starts for name in (start.nodes or (start.node,))}
    if not names:
        return set()
    return {name for name, state, lost in session.execute(
        select(Node.name, Node.state, Node.lost_at)
        .where(Node.id.in_([node_ids[n] for n in names if n in node_ids]))
        .order_by(Node.id).with_for_update(read=True))
        if state == "UP" and lost is None}


def _update_pending(session: Session, snapshot: Snapshot, plan: Plan) -> None:
    """Store each waiting job's reason and expected start where they changed (a start
    only when it moved by a second or more), in one statement."""
    before = {job.job_id: job for job in snapshot.pending}
    rows = []
    for decided in plan.pending:
        old = before[decided.job_id]
        at, was = decided.expected_start, old.expected_start
        moved = (at is None) != (was is None) or (at is not None and abs(at - (was or 0)) >= 1)
        if moved or decided.reason != old.reason:
            keep = at if moved else was
            rows.append({"jid": decided.job_id, "r": decided.reason.value,
                         "at": None if keep is None else datetime.fromtimestamp(keep, UTC)})
    if rows:
        # Core executemany (one statement, many parameter sets), not an ORM bulk update.
        jobs_table = Job.__table__
        assert isinstance(jobs_table, Table)
        session.connection().execute(
            update(jobs_table).where(jobs_table.c.id == bindparam("jid"),
                                     jobs_table.c.state == "PENDING")
            .values(reason=bindparam("r"), expected_start=bindparam("at")), rows)