"""Accounting: what jobs used, from their GPU allocations (every run of a requeued job
counts), billed by GPU type; a share of a GPU counts as its fraction of it (25 of the
100 units a GPU offers: a quarter of a GPU), a MIG slice as one GPU of its type."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.orm import Session

from gpusched.core.jobcontrol import suspended_seconds
from gpusched.core.usage import gpu_fraction
from gpusched.db.jobcontrol import shown_state
from gpusched.db.models import Allocation, Gpu, GpuBilling, Job, JobStep, Node
from gpusched.db.steps import step_view, steps_of
from gpusched.db.usage import ShareOffers

STEP_FIELDS = ("step_id", "name", "state", "exit_code", "signal", "node_names", "ntasks",
               "start_time", "end_time", "elapsed_s", "max_rss_bytes", "cpu_usec", "error")
SHOWN_STATES = ("RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                "OUT_OF_MEMORY", "DEADLINE")


class Held(NamedTuple):
    """What a job held: GPU-seconds and billed GPU-seconds (a share counting as its
    fraction of the GPU), and the GPUs of its latest run (``_holding`` dicts)."""

    gpu_s: float
    billed_s: float
    latest: list[dict[str, Any]]
    runs: list[dict[str, Any]] = []  # each run: start, end, node_names, gpus (sacct -D)


def _held(session: Session, jobs: list[Job], start: datetime | None, end: datetime | None,
          now: datetime, latest: bool = True) -> dict[int, Held]:
    """What each of ``jobs`` held, each holding cut to [start, end] (its latest run's
    GPUs only if ``latest``)."""
    if not jobs:
        return {}
    job_of = {job.id: job for job in jobs}
    offers = ShareOffers(session)
    node_names = dict(session.execute(select(Node.id, Node.name)).all())
    rows = session.execute(
        select(Allocation.job_id, Allocation.allocated_at, Allocation.released_at,
               func.coalesce(GpuBilling.weight, 1.0), Allocation.node_id, Allocation.units,
               Allocation.mem_mb, Gpu.index, Gpu.uuid, Gpu.gpu_type, Gpu.mig_profile)
        .join(Gpu, Gpu.id == Allocation.gpu_id)
        .outerjoin(GpuBilling, GpuBilling.gpu_type == Gpu.gpu_type)
        .where(Allocation.job_id.in_(list(job_of))))
    used: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    runs: dict[int, tuple[datetime, list[dict[str, Any]]]] = {}
    every: dict[int, dict[datetime, dict[str, Any]]] = defaultdict(dict)
    for (job_id, held_from, held_to, weight, node_id, units, mem, index, uuid, gpu_type,
         profile) in rows:
        job, node = job_of[job_id], node_names.get(node_id, "")
        of = offers.of(units, node, job.partition)
        fraction = gpu_fraction(units, of)
        begin = max(held_from, start) if start else held_from
        finish = min(held_to or now, end) if end else (held_to or now)
        seconds = max(0.0, (finish - begin).total_seconds()) * fraction
        used[job_id][0] += seconds
        used[job_id][1] += seconds * float(weight)
        if not latest:
            continue
        one = every[job_id].setdefault(held_from, {"start": held_from, "end": held_to,
                                                   "node_names": set(), "gpus": 0})
        one["end"] = None if held_to is None or one["end"] is None else max(one["end"], held_to)
        one["node_names"].add(node)
        one["gpus"] += 1
        run = runs.get(job_id)
        if run is None or held_from > run[0]:  # a run's GPUs are allocated at one time
            run = runs[job_id] = (held_from, [])
        if held_from == run[0]:
            run[1].append(_holding(node, index, uuid, gpu_type, profile, job.share_mode,
                                   units, of, mem, fraction))
    for _, holdings in runs.values():
        holdings.sort(key=lambda h: (h["node"], h["gpu_index"]))
    return {job_id: Held(a, b, runs[job_id][1] if latest else [], [
        {"start": r["start"].isoformat(), "end": r["end"].isoformat() if r["end"] else None,
         "node_names": sorted(r["node_names"]), "gpus": r["gpus"]}
        for _, r in sorted(every[job_id].items())]) for job_id, (a, b) in used.items()}


def _holding(node: str, index: int, uuid: str, gpu_type: str | None, profile: str | None,
             mode: str | None, units: int | None, of: int | None, mem: int | None,
             fraction: float) -> dict[str, Any]:
    """One GPU a job held: whole, a MIG slice (``mig_profile``) or a share (``share_mode``
    mps or shard, ``units`` of the ``of`` the GPU offers, ``mem_mb`` of its memory); a
    job that asked only for GPU memory and got a share holds it by MPS."""
    share = units is not None
    return {"node": node, "gpu_index": index, "gpu_uuid": uuid, "gpu_type": gpu_type,
            "mig_profile": profile, "share_mode": (mode or "mps") if share else None,
            "units": units, "of": of if share else None, "mem_mb": mem if share else None,
            "fraction": fraction}


def alloc_tres(holdings: list[dict[str, Any]]) -> str:
    """What a run held, as sacct's AllocTRES writes GPUs: ``gres/gpu=2`` (whole GPUs),
    ``gres/gpu:1g.10gb=1`` (MIG slices by profile), ``gres/mps=25`` or ``gres/shard=2``
    (units of a shared GPU); ``""`` when it held none."""
    counts: dict[str, int] = {}
    for held in holdings:
        if held["share_mode"] is not None:
            key, amount = f"gres/{held['share_mode']}", held["units"]
        elif held["mig_profile"] is not None:
            key, amount = f"gres/gpu:{held['mig_profile']}", 1
        else:
            key, amount = "gres/gpu", 1
        counts[key] = counts.get(key, 0) + amount
    return ",".join(f"{key}={amount}" for key, amount in sorted(counts.items()))


def _jobs(session: Session, users: list[str] | None, accounts: list[str] | None,
          states: list[str] | None, ids: list[int] | None, start: datetime | None,
          end: datetime | None, requeued: bool = False) -> list[Job]:
    """The jobs in ``states`` (default SHOWN_STATES) that match; with ``requeued``, the
    jobs back in the queue after a run too (their runs used GPUs)."""
    shown: ColumnElement[bool] = Job.state.in_(states or SHOWN_STATES)
    if requeued:
        shown = or_(shown, (Job.state == "PENDING") & (Job.restarts > 0))
    stmt = select(Job).where(shown).order_by(Job.id)
    if users:
        stmt = stmt.where(Job.user_name.in_(users))
    if accounts:
        stmt = stmt.where(Job.account.in_(accounts))
    if ids:
        stmt = stmt.where(or_(Job.id.in_(ids), Job.array_job_id.in_(ids)))
    if start is not None:  # ran (or ended) within the window
        stmt = stmt.where(or_(Job.end_time.is_(None), Job.end_time >= start))
    if end is not None:
        stmt = stmt.where(func.coalesce(Job.start_time, Job.end_time, Job.submit_time) <= end)
    return list(session.scalars(stmt))


def job_records(session: Session, users: list[str] | None = None,
                accounts: list[str] | None = None, states: list[str] | None = None,
                ids: list[int] | None = None, start: datetime | None = None,
                end: datetime | None = None) -> list[dict[str, Any]]:
    """Finished and running jobs with elapsed time, GPU-hours (all of their runs) and
    billed GPU-hours, and their GPU utilisation; what its latest run held (``alloc``,
    ``_holding`` dicts, and ``alloc_tres``, as sacct's AllocTRES); a job that ran steps
    lists them (``steps``: its batch script as step ``batch``, then each step)."""
    now = datetime.now(UTC)
    found = _jobs(session, users, accounts, states, ids, start, end)
    held = _held(session, found, None, None, now)
    job_steps = steps_of(session, [j.id for j in found])
    batch_nodes = dict(session.execute(select(Node.id, Node.name).where(Node.id.in_(
        {j.node_id for j in found if j.id in job_steps and j.node_id is not None})))
        .all()) if job_steps else {}
    records = []
    for job in found:
        gpu_s, billed_s, latest, job_runs = held.get(job.id) or Held(0.0, 0.0, [])
        elapsed = ((job.end_time or now) - job.start_time).total_seconds() if job.start_time else 0.0
        # gcontrol suspend: the time suspended is not run time (sacct's Elapsed, Suspended).
        paused = suspended_seconds(job.suspended_seconds, job.suspended_at.timestamp()
                                   if job.suspended_at else None, (job.end_time or now).timestamp())
        records.append({
            "job_id": job.id, "array_job_id": job.array_job_id, "array_task_id": job.array_task_id,
            "name": job.name, "user": job.user_name, "account": job.account,
            "partition": job.partition, "state": shown_state(job.state, job.suspended_at),
            "reason": job.reason, "exit_code": job.exit_code,
            "signal": job.signal, "submit_time": job.submit_time.isoformat(),
            "start_time": job.start_time.isoformat() if job.start_time else None,
            "end_time": job.end_time.isoformat() if job.end_time else None,
            "elapsed_s": max(0.0, elapsed - paused), "suspended_s": paused, "gpus": job.gpus,
            "restarts": job.restarts, "alloc_tres": alloc_tres(latest), "alloc": latest,
            "gpu_hours": gpu_s / 3600, "billed_gpu_hours": billed_s / 3600,
            "gpu_util_avg": job.util_sum / job.util_samples if job.util_samples else None,
            "gpu_util_peak": job.util_peak, "gpu_mem_peak_mb": job.mem_peak_mb,
            "max_rss_bytes": job.max_rss_bytes, "cpu_usec": job.cpu_usec,
            "error_message": job.error_message,
            "idle_action": job.idle_action, "idle_reason": job.idle_reason,
            "qos": job.qos, "uid": job.uid, "nodes": job.nodes, "cpus": job.cpus,
            "mem_mb": job.mem_mb, "time_limit": job.time_limit, "work_dir": job.work_dir,
            "constraint": job.constraints, "reservation": job.reservation, "gid": job.gid,
            "runs": job_runs,
            "steps": _step_records(job, job_steps.get(job.id, []), batch_nodes, now)})
    return records


def _step_records(job: Job, steps: list[JobStep], batch_nodes: dict[int, str],
                  now: datetime) -> list[dict[str, Any]]:
    """The job's batch script as step ``batch`` and each of its steps, as sacct lists
    them (none for a job that ran no steps)."""
    if not steps:
        return []
    node = job.node_names[0] if job.node_names else batch_nodes.get(job.node_id or 0)
    elapsed = ((job.end_time or now) - job.start_time).total_seconds() if job.start_time else 0.0
    rows = [{"step": "batch", "step_id": None, "name": "batch", "state": job.state,
             "exit_code": job.exit_code, "signal": job.signal,
             "node_names": [node] if node else [], "ntasks": 1,
             "start_time": job.start_time.isoformat() if job.start_time else None,
             "end_time": job.end_time.isoformat() if job.end_time else None,
             "elapsed_s": max(0.0, elapsed), "max_rss_bytes": job.max_rss_bytes,
             "cpu_usec": job.cpu_usec, "error": None}]
    for step in steps:
        view = step_view(step, now)
        rows.append({"step": str(step.step_id), **{k: view[k] for k in STEP_FIELDS}})
    return rows


def usage_report(session: Session, start: datetime, end: datetime) -> list[dict[str, Any]]:
    """GPU-hours and billed GPU-hours per (account, user) within [start, end]: each GPU
    holding is cut to the window; the runs of a job back in the queue count too."""
    now = datetime.now(UTC)
    found = _jobs(session, None, None, None, None, start, end, requeued=True)
    held = _held(session, found, start, end, now, latest=False)
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for job in found:
        gpu_s, billed_s, _, _ = held.get(job.id) or Held(0.0, 0.0, [])
        if gpu_s <= 0:
            continue
        row = totals[(job.account or "", job.user_name)]
        row[0] += 1
        row[1] += gpu_s / 3600
        row[2] += billed_s / 3600
    return [{"account": account or None, "user": user, "jobs": int(n), "gpu_hours": hours,
             "billed_gpu_hours": billed}
            for (account, user), (n, hours, billed) in sorted(totals.items())]
