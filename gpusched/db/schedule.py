"""The database side of a scheduling pass: load a Snapshot in bulk, apply a Plan."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import case as sql_case
from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from gpusched.core.arrays import drop_first
from gpusched.core.licenses import stored_licenses
from gpusched.core.model import (
    GpuView,
    NodeState,
    NodeView,
    PendingJob,
    Plan,
    RunningJob,
    Snapshot,
    Start,
)
from gpusched.core.sharing import share_nodes
from gpusched.core.topology import link_rank
from gpusched.db import commands
from gpusched.db.admincache import AdminCache, load_admin_tables
from gpusched.db.budgets import usage_of
from gpusched.db.dependency_states import dependency_states
from gpusched.db.engine import rowcount
from gpusched.db.leadership import check_epoch
from gpusched.db.models import Job, Partition
from gpusched.db.pending_rows import PENDING_SQL, PendingRows
from gpusched.db.reservations import with_reservations
from gpusched.db.timecut import apply_time_cuts


def _columns(*fields: str, order: str = "") -> str:
    """An aggregate of ``fields`` as a JSON array of columns, one JSON array each (null
    for no rows), a row's values at the same place in each."""
    return "json_build_array(" + ", ".join(f"json_agg({f}{order})" for f in fields) + ")"


# A node's features: its GPUs' (as its agent reported them) and its admin's.
_FEATURES = ("features || coalesce((SELECT f.features FROM node_features AS f "
             "WHERE f.node = nodes.name), '{}')")
# Everything a pass reads but the admin tables and the states of jobs named in
# dependencies, in one statement (one round trip, and all of one moment), each part as
# _columns: nodes by name; present GPUs; the links between present GPUs; the GPUs of
# live allocations by job and index; running jobs; fair-share usage; the pending queue
# (pending_rows.PENDING_SQL). Times are in seconds since the epoch.
_SNAPSHOT = text(
    "SELECT (SELECT "
    + _columns("id", "name", "state", "run_uid", "cpus", "memory_mb", "block", _FEATURES,
               order=" ORDER BY name") + " FROM nodes), "
    "(SELECT " + _columns("id", "node_id", '"index"', "uuid", "healthy", "gpu_type",
                          "mig_profile", "parent_id", "memory_mb") + " FROM gpus WHERE present), "
    "(SELECT " + _columns("a.node_id", 'a."index"', 'b."index"', "l.kind", "l.nvlinks")
    + " FROM gpu_links AS l JOIN gpus AS a ON a.id = l.gpu_a AND a.present "
    "JOIN gpus AS b ON b.id = l.gpu_b AND b.present), "
    "(SELECT " + _columns("al.job_id", "g.uuid", "al.units", "al.mem_mb",
                          order=' ORDER BY al.job_id, g."index"')
    + " FROM allocations AS al JOIN gpus AS g ON g.id = al.gpu_id "
    "WHERE al.released_at IS NULL), "
    # From the jobs table, not the allocations: a job without GPUs counts toward job limits.
    "(SELECT " + _columns("j.id", "n.name", "j.user_name", "j.account", "j.qos", "j.name",
                          "j.array_job_id", "extract(epoch FROM j.start_time)",
                          # gcontrol suspend: the time suspended is not counted.
                          "(j.time_limit + ceil(j.suspended_seconds + coalesce(extract(epoch "
                          "FROM now() - j.suspended_at), 0)))::integer",
                          "j.cpus", "j.mem_mb", "j.node_names",
                          "extract(epoch FROM j.preempted_at)", "j.exclusive", "j.licenses")
    + " FROM jobs AS j JOIN nodes AS n ON n.id = j.node_id WHERE j.state = 'RUNNING'), "
    "(SELECT " + _columns("user_name", "account", "usage") + " FROM fairshare_usage), "
    "(SELECT " + _columns("id", "constraints") + " FROM jobs WHERE state = 'PENDING' "
    "AND constraints IS NOT NULL), "
    + PENDING_SQL
)


def _rows(columns: list[list[Any] | None]) -> list[tuple[Any, ...]]:
    """The rows of a _columns answer."""
    return list(zip(*columns)) if columns[0] is not None else []


def _nodes(node_rows: list[tuple[Any, ...]], gpu_rows: list[tuple[Any, ...]],
           link_rows: list[tuple[Any, ...]]) -> tuple[tuple[NodeView, ...], dict[str, int]]:
    """Nodes with their GPUs and MIG slices in index order, and node ids by name."""
    index_of = {gpu_id: index for gpu_id, _, index, *_ in gpu_rows}
    parents = {row[7] for row in gpu_rows if row[7] is not None}
    gpus: dict[int, list[GpuView]] = {}
    for gpu_id, node_id, index, uuid, healthy, gpu_type, profile, parent, memory in gpu_rows:
        gpus.setdefault(node_id, []).append(GpuView(
            uuid, index, healthy, gpu_type or "gpu", profile,
            index_of.get(parent) if parent is not None else None, gpu_id in parents,
            memory_mb=memory or 0))
    links: dict[int, dict[tuple[int, int], int]] = {}
    for node_id, a, b, kind, nvlinks in link_rows:
        links.setdefault(node_id, {})[(a, b) if a <= b else (b, a)] = link_rank(kind, nvlinks)
    nodes = tuple(
        NodeView(name, NodeState(state), tuple(sorted(gpus.get(nid, []), key=lambda g: g.index)),
                 run_uid, cpus, memory_mb, block, links.get(nid, {}), frozenset(features))
        for nid, name, state, run_uid, cpus, memory_mb, block, features in node_rows
    )
    return nodes, {name: nid for nid, name, *_ in node_rows}


def _running(allocated: list[tuple[Any, ...]], rows: list[tuple[Any, ...]], grace: float
             ) -> tuple[tuple[RunningJob, ...], frozenset[tuple[str, str]]]:
    """Running jobs with their GPUs (whole, and shares), and the (user, name) pairs
    singleton checks."""
    gpus_of: dict[int, list[str]] = {}
    shares_of: dict[int, list[tuple[str, int, int]]] = {}
    for job_id, uuid, units, mem in allocated:
        if units is None:
            gpus_of.setdefault(job_id, []).append(uuid)
        else:
            shares_of.setdefault(job_id, []).append((uuid, units, mem or 0))

    def ends(start: float | None, limit: int | None, preempted: float | None) -> float | None:
        end = start + limit if start is not None and limit else None
        if preempted is not None:  # stopping: gone once the grace time is over
            stop = preempted + grace
            end = stop if end is None else min(end, stop)
        return end

    running = []
    for (job_id, node, user, account, qos, _, array_job, start, limit, cpus, mem, names,
         preempted, exclusive, licenses) in rows:
        start = None if start is None else float(start)
        preempted = None if preempted is None else float(preempted)
        running.append(RunningJob(
            job_id, node, tuple(gpus_of.get(job_id, ())), user, account, qos, array_job,
            ends(start, limit, preempted), cpus, mem, tuple(names or ()), start,
            preempted is not None, exclusive, tuple(shares_of.get(job_id, ())),
            stored_licenses(licenses)))
    return tuple(running), frozenset((row[2], row[5]) for row in rows)


def with_constraints(pending: tuple[PendingJob, ...], rows: list[tuple[Any, ...]]
                     ) -> tuple[PendingJob, ...]:
    """The pending jobs with their -C constraints (``rows``: id, canonical text)."""
    if not rows:
        return pending
    found = dict(rows)
    return tuple(replace(job, constraint=found[job.job_id]) if job.job_id in found else job
                 for job in pending)


def load_snapshot(session: Session, preempt_grace: float = 30.0,
                  admin: AdminCache | None = None,
                  pending_rows: PendingRows | None = None) -> tuple[Snapshot, dict[str, int]]:
    """Everything a pass needs, in one statement (_SNAPSHOT) but for the admin tables
    and the states of jobs named in dependencies (only when a pending job has one) and
    the usage of GPU-hour budgets (only when there are some); also node ids by name.

    A running job being preempted counts as ending ``preempt_grace`` seconds after it
    was told to stop. The admin-configured tables come from ``admin`` when given (read
    only when they may have changed), else are read here; the pending jobs are kept in
    ``pending_rows`` when given (only rows changed since its last read are read in full).
    """
    queue = pending_rows if pending_rows is not None else PendingRows()
    (node_rows, gpu_rows, link_rows, allocated, running_rows, usage_rows, constrained,
     pending_answer) = session.connection().execute(_SNAPSHOT, queue.params()).one()
    nodes, node_ids = _nodes(_rows(node_rows), _rows(gpu_rows), _rows(link_rows))
    pending = with_constraints(queue.take(pending_answer), _rows(constrained))
    running, running_names = _running(_rows(allocated), _rows(running_rows), preempt_grace)
    tables = admin.tables(session) if admin is not None else load_admin_tables(session)
    job_states, job_began = dependency_states(session, pending)
    partitions = tables.partitions_over(tuple(node_ids))
    snapshot = Snapshot(
        nodes=share_nodes(nodes, partitions), partitions=partitions, pending=pending,
        running=running, accounts=tables.accounts, user_shares=tables.user_shares,
        usage={(u, a): float(value) for u, a, value in _rows(usage_rows)},
        qos_priority=tables.qos_priority, qos_limits=tables.qos_limits,
        qos_preempt=tables.qos_preempt,
        job_states=job_states, job_began=job_began,
        running_names=running_names,
        budgets=usage_of(session, list(tables.budgets), tables.accounts, time.time()),
        licenses=tables.licenses,
    )
    if tables.reservations:  # advance reservations and the jobs asking for them
        snapshot = with_reservations(session, snapshot, tables.reservations)
    return snapshot, node_ids


# What a task split off an array's record takes from it (the rest is the task's own).
_TASK_COPIES = ("name", "uid", "gid", "user_name", "partition", "account", "qos", "begin_time",
                "dependency", "gpus", "time_limit", "submit_time", "script_id", "work_dir",
                "output", "error", "array_job_id", "array_spec",
                "array_max_running", "gpu_types", "nodes", "cpus", "mem_mb", "nodelist",
                "exclude_nodes", "warn_signal", "warn_seconds", "warn_batch_only",
                "nice", "open_mode", "time_min", "deadline",
                "admin_priority", "exclusive", "umask", "gres_flags", "requeue", "reservation",
                "share_mode", "share_units", "gpu_mem_mb", "licenses", "container", "constraints")
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
            "suspended_at": None, "suspended_seconds": 0,  # of a run before
            # An allocation's client has the grace from its start to say it is there.
            "client_seen": sql_case((Job.interactive, now), else_=Job.client_seen)}


# Allocations of GPUs from :now, one for each (job, GPU UUID) pair of :alloc_jobs and
# :alloc_uuids, in their order, to the GPU row of that UUID as it is now.
_ALLOCATE = (
    "INSERT INTO allocations (job_id, gpu_id, node_id, allocated_at, units, mem_mb) "
    "SELECT a.job, g.id, g.node_id, :now, a.units, a.mem FROM unnest("
    "CAST(:alloc_jobs AS bigint[]), CAST(:alloc_uuids AS text[]), "
    "CAST(:alloc_units AS integer[]), CAST(:alloc_mems AS integer[])) "
    "WITH ORDINALITY AS a(job, uuid, units, mem, n) "
    "JOIN gpus AS g ON g.uuid = a.uuid {where}ORDER BY a.n RETURNING job_id"
)
_ALLOCATE_TASKS = text(f"WITH placed AS ({_ALLOCATE.format(where='')}) "
                       "SELECT count(*) FROM placed")
# The starts of whole jobs in one guarded UPDATE: each row changes only if it is still
# PENDING, and RETURNING names those that did, with what their launch needs; then, in
# the same statement, the allocations of the jobs it started (the count of those made
# in each row returned).
_START_JOBS = text(
    "WITH started AS (UPDATE jobs SET state = 'RUNNING', reason = 'None', start_time = :now, "
    "node_id = t.node, start_kind = t.kind, expected_start = NULL, "
    "suspended_at = NULL, suspended_seconds = 0, "
    "node_names = CASE WHEN t.names IS NULL THEN NULL "
    "ELSE ARRAY(SELECT jsonb_array_elements_text(t.names)) END, "
    # An allocation's client has the grace from its start to say it is there.
    "client_seen = CASE WHEN jobs.interactive THEN :now ELSE jobs.client_seen END "
    "FROM unnest(CAST(:ids AS integer[]), CAST(:nodes AS integer[]), CAST(:kinds AS text[]), "
    "CAST(:names AS jsonb[])) AS t(id, node, kind, names) "
    "WHERE jobs.id = t.id AND jobs.state = 'PENDING' "
    "RETURNING jobs.id, jobs.restarts, jobs.interactive), "
    f"placed AS ({_ALLOCATE.format(where='WHERE a.job IN (SELECT id FROM started) ')}) "
    "SELECT id, restarts, interactive, (SELECT count(*) FROM placed) FROM started"
)


def _allocations(started: list[tuple[int, Start]]) -> dict[str, list[Any]]:
    """The :alloc_jobs, :alloc_uuids, :alloc_units and :alloc_mems of the GPUs of
    ``started`` (job id, start): units and memory for a share, NULL for a whole GPU."""
    shares = [({uuid: (units, mem) for uuid, units, mem in start.shares}
               if start.shares else None) for _, start in started]
    held = [(job_id, uuid, None if share is None else share.get(uuid))
            for (job_id, start), share in zip(started, shares) for uuid in start.gpu_uuids]
    return {"alloc_jobs": [job_id for job_id, _, _ in held],
            "alloc_uuids": [uuid for _, uuid, _ in held],
            "alloc_units": [None if part is None else part[0] for _, _, part in held],
            "alloc_mems": [None if part is None else part[1] for _, _, part in held]}


def _check_allocated(started: list[tuple[int, Start]], made: int) -> None:
    """Fail the pass (rolled back) unless each GPU of ``started`` got its allocation."""
    if made != sum(len(start.gpu_uuids) for _, start in started):
        raise LookupError(f"a GPU of the jobs started is gone: {started}")


def _start_jobs(session: Session, starts: list[Start], node_ids: dict[str, int],
                now: datetime) -> dict[int, tuple[int, bool]]:
    """Start whole jobs (not array tasks) that are still PENDING and allocate their
    GPUs; for each started, its restart count and whether it is an allocation."""
    if not starts:
        return {}
    rows = session.connection().execute(_START_JOBS, {
        "now": now, "ids": [start.job_id for start in starts],
        "nodes": [node_ids[start.node] for start in starts],
        "kinds": [start.kind.value for start in starts],
        "names": [json.dumps(list(start.nodes)) if start.nodes else None for start in starts],
        **_allocations([(start.job_id, start) for start in starts]),
    }).all()
    started = {job_id: (restarts, interactive) for job_id, restarts, interactive, _ in rows}
    _check_allocated([(start.job_id, start) for start in starts if start.job_id in started],
                     rows[0][3] if rows else 0)
    return started


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


# The run (restart count) of each job of :ids that is not an allocation.
_RUNS = text("SELECT id, restarts FROM jobs WHERE id = ANY(CAST(:ids AS bigint[])) "
             "AND NOT interactive")


def apply_plan(session: Session, snapshot: Snapshot, plan: Plan,
               node_ids: dict[str, int], epoch: int | None = None) -> set[str]:
    """Write the plan with guarded UPDATEs and the node commands it makes (a launch
    for each started job, a cancel for each job preempted), stamped with ``epoch``;
    returns the nodes that got commands.

    With an ``epoch`` (the leader's), the leader row is held first and the plan is
    refused (NotLeader, nothing written) unless that epoch is still the current one.
    A start whose job is no longer PENDING (cancelled since the snapshot) is skipped,
    and so is one on a node no longer UP (given up, drained since the snapshot); the
    nodes it starts jobs on are held (FOR SHARE) until the commit, so that none is given
    up meanwhile. The partial unique index on allocations turns any double allocation
    into an error that rolls the whole pass back, and so does a GPU of a start that is
    gone.
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
        tasks_started: dict[int, Start] = {}
        for record_id, starts in tasks_of.items():
            tasks_started.update(_start_tasks(session, records[record_id], starts, node_ids, now))
        if tasks_started:
            split = list(tasks_started.items())
            _check_allocated(split, session.connection().execute(
                _ALLOCATE_TASKS, {"now": now, **_allocations(split)}).scalar_one())
        started.update(tasks_started)
    _update_pending(session, snapshot, plan)
    apply_time_cuts(session, started, plan, now)  # --time-min and --deadline
    if started:
        # Its batch script runs on its first node (the start's node), as Slurm's does;
        # an allocation (interactive) launches nothing: its client runs steps on it.
        runs = {job_id: restarts for job_id, (restarts, interactive) in whole_started.items()
                if not interactive}
        tasks = [job_id for job_id in started if job_id not in whole_started]
        if tasks:
            runs.update(session.connection().execute(_RUNS, {"ids": tasks}).all())
        commands.issue(session, "launch", [
            (job_id, runs[job_id], node_ids[start.node]) for job_id, start in started.items()
            if job_id in runs], epoch=epoch)
    woken = {start.node for start in started.values()}
    for preemption in plan.preemptions:
        stopping = session.execute(
            update(Job).where(Job.id == preemption.job_id, Job.state == "RUNNING",
                              Job.cancel_requested_at.is_(None))
            .values(cancel_requested_at=now, preempted_at=now,
                    preempt_mode=_preempt_mode(preemption.mode),
                    preempted_by=preemption.by)
            .returning(Job.id, Job.restarts, Job.node_id)).all()
        targets = [(job_id, run, node_id) for job_id, run, node_id in stopping
                   if node_id is not None]
        commands.issue(session, "cancel", targets, epoch=epoch)
        woken.update(name for name, node_id in node_ids.items()
                     if node_id in {t[2] for t in targets})
    return woken


def _preempt_mode(mode: str) -> Any:
    """The preempt mode stored for a victim: a job that may not be requeued (its own
    ``--no-requeue``, else its partition's default, as health.may_requeue reads them) is
    cancelled instead of requeued, as under Slurm's PreemptMode=REQUEUE."""
    if mode != "requeue":
        return mode
    may_requeue = func.coalesce(Job.requeue, select(Partition.requeue).where(
        Partition.name == Job.partition).scalar_subquery(), True)
    return sql_case((may_requeue, "requeue"), else_="cancel")


# The nodes of :ids, each with whether it is UP and not given up, held FOR SHARE in
# the order of their ids.
_USABLE_NODES = text(
    "SELECT name, state = 'UP' AND lost_at IS NULL FROM nodes "
    "WHERE id = ANY(CAST(:ids AS integer[])) ORDER BY id FOR SHARE")


def _usable_nodes(session: Session, starts: tuple[Start, ...], node_ids: dict[str, int]
                  ) -> set[str]:
    """The nodes of ``starts`` that are UP and not given up, their rows held FOR SHARE
    for the rest of the transaction."""
    names = {name for start in starts for name in (start.nodes or (start.node,))}
    if not names:
        return set()
    return {name for name, usable in session.connection().execute(
        _USABLE_NODES, {"ids": [node_ids[n] for n in names if n in node_ids]}) if usable}


# Reasons and expected starts of waiting jobs, each row changed only while PENDING.
_UPDATE_PENDING = text(
    "UPDATE jobs SET reason = t.reason, expected_start = t.at "
    "FROM unnest(CAST(:ids AS bigint[]), CAST(:reasons AS text[]), "
    "CAST(:ats AS timestamptz[])) AS t(id, reason, at) "
    "WHERE jobs.id = t.id AND jobs.state = 'PENDING'")


def _update_pending(session: Session, snapshot: Snapshot, plan: Plan) -> None:
    """Store each waiting job's reason and expected start where they changed (a start
    only when it moved by a second or more), in one statement."""
    before = {job.job_id: job for job in snapshot.pending}
    ids, reasons, ats = [], [], []
    for decided in plan.pending:
        old = before[decided.job_id]
        at, was = decided.expected_start, old.expected_start
        moved = (at is None) != (was is None) or (at is not None and abs(at - (was or 0)) >= 1)
        if moved or decided.reason != old.reason:
            keep = at if moved else was
            ids.append(decided.job_id)
            reasons.append(decided.reason.value)
            ats.append(None if keep is None else datetime.fromtimestamp(keep, UTC))
    if ids:
        session.connection().execute(_UPDATE_PENDING,
                                     {"ids": ids, "reasons": reasons, "ats": ats})
