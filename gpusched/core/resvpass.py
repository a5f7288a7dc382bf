"""A pass with advance reservations: the jobs in each reservation first, on what it
holds, then every other job around the reservations' windows.

Jobs that ask for a reservation (``--reservation``) run only on its nodes (or its GPUs
there) while an occurrence of it goes on, and end by the occurrence's end (unless it is
FLEX): a longer time limit is cut to end there, as Slurm ends them when it ends. Each
reservation going on gets a pass of its own over a snapshot of just what it holds; its
starts then count as running jobs in the pass of every other job, in which every
reservation's windows are held (core/resvholds.py). A job whose reservation
is not going on (or is gone, or no longer lets it in) waits with reason Reservation; a
FLEX reservation's job that found no room in it is placed as any other job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from gpusched.core.model import (
    NodeView,
    Pending,
    PendingJob,
    Plan,
    Policy,
    Preemption,
    Reason,
    Reservation,
    RunningJob,
    Snapshot,
    Start,
)
from gpusched.core.plan import Moment, SchedulingPass, queue_order
from gpusched.core.reservations import (
    INF,
    AdvanceReservation,
    active,
    may_use,
    next_occurrence,
    over,
)
from gpusched.core.resvholds import main_kind

MINUTE = 60  # a limit cut to a reservation's end is whole minutes, as Slurm's limits


def plan_with_reservations(snapshot: Snapshot, now: float, policy: Policy,
                           resume_after: int | None = None,
                           spent: Callable[[], float] | None = None,
                           watch: int | None = None) -> tuple[Plan, Moment | None]:
    """``plan`` for a snapshot with advance reservations, and the Moment of ``watch``
    (the job ``explain`` asks about) when the pass reached it."""
    live = tuple(r for r in snapshot.advance_reservations if not over(r, now))
    by_name = {r.name: r for r in live}
    inside: dict[str, list[PendingJob]] = {}
    others: list[PendingJob] = []
    for job in snapshot.pending:
        (inside.setdefault(job.reservation, []) if job.reservation else others).append(job)
    starts: list[Start] = []
    pending: list[Pending] = []
    reservations: list[Reservation] = []
    preemptions: list[Preemption] = []
    moment: Moment | None = None
    added: list[RunningJob] = []
    names: set[tuple[str, str]] = set()
    for name, jobs in sorted(inside.items()):
        resv = by_name.get(name)
        window = None if resv is None else active(resv, now)
        allowed = [j for j in jobs if resv is not None and may_use(resv, j.user, j.account)]
        let_in = {j.job_id for j in allowed}
        if resv is None or window is None or not allowed:
            for job in jobs:
                if resv is not None and resv.flex and job.job_id in let_in:
                    others.append(job)  # FLEX: it may start outside the reservation
                    continue
                pending.append(_waits_for(job, resv, now))
                if job.job_id == watch:
                    moment = _still(job)
            continue
        for job in jobs:
            if job.job_id not in let_in:
                pending.append(_waits_for(job, resv, now))
                if job.job_id == watch:
                    moment = _still(job)
        fitted = allowed if resv.flex else [_fitted(j, window[1], now) for j in allowed]
        inner = _inner_snapshot(snapshot, resv, window[1], live, fitted, added)
        runner = SchedulingPass(inner, now, policy, watch=watch)
        decided = runner.run(queue_order(inner, now, policy))
        if runner.moment is not None:
            moment = runner.moment
        reservations.extend(decided.reservations)
        preemptions.extend(decided.preemptions)
        started = {s.job_id for s in decided.starts}
        jobs_by_id = {j.job_id: j for j in fitted}
        originals = {j.job_id: j for j in allowed}
        for start in decided.starts:
            job = jobs_by_id[start.job_id]
            if job is not originals[start.job_id] and start.time_limit is None:
                start = replace(start, time_limit=job.time_limit)  # cut to its end
            starts.append(start)
            added.append(_as_running(job, start, now, name))
            names.add((job.user, job.name))
        for wait in decided.pending:
            job = jobs_by_id[wait.job_id]
            if resv.flex and wait.job_id not in started:
                others.append(originals[wait.job_id])
            else:
                pending.append(_inner_reason(wait, job, window[1], now))
    outer = replace(snapshot, pending=tuple(others), running=(*snapshot.running, *added),
                    running_names=snapshot.running_names | names,
                    advance_reservations=live)
    runner = SchedulingPass(outer, now, policy, watch=watch)
    decided = runner.run(queue_order(outer, now, policy), resume_after, spent)
    if runner.moment is not None:
        moment = runner.moment
    return Plan(starts=(*starts, *decided.starts), pending=(*pending, *decided.pending),
                reservations=(*reservations, *decided.reservations),
                preemptions=(*preemptions, *decided.preemptions), resume_after=decided.resume_after), moment


def _waits_for(job: PendingJob, resv: AdvanceReservation | None, now: float) -> Pending:
    """Reason Reservation, expected to start when its reservation next begins."""
    upcoming = None if resv is None else next_occurrence(resv, now)
    at = upcoming[0] if upcoming is not None and upcoming[0] > now else None
    if resv is None or not may_use(resv, job.user, job.account):
        at = None
    return Pending(job.job_id, Reason.RESERVATION, at)


def _still(job: PendingJob) -> Moment:
    """What explain sees of a job no pass looked at: it waits for its reservation."""
    return Moment(job, (Reason.RESERVATION,), None, None, (0, 0, 0), 0)


def _fitted(job: PendingJob, end: float, now: float) -> PendingJob:
    """``job`` with its time limit cut to end by the occurrence's ``end`` (in whole
    minutes), where it would run past it: Slurm ends a reservation's jobs at its end.
    Unchanged when less than a minute is left (it then waits for the next one)."""
    room = int(end - now) // MINUTE * MINUTE
    if room < MINUTE or (job.time_limit is not None and job.time_limit <= room):
        return job
    return replace(job, time_limit=room)


def _inner_reason(wait: Pending, job: PendingJob, end: float, now: float) -> Pending:
    """A reservation's job that did not start: a time limit running past the
    occurrence's end is its reservation's fault (Reservation), not the nodes'."""
    limit = INF if job.time_limit is None else job.time_limit
    if now + limit > end or wait.reason is Reason.REQ_NODE_NOT_AVAIL:
        return Pending(wait.job_id, Reason.RESERVATION, None)
    return wait


def _view(node: NodeView, gpus: int, mine: set[str], busy: set[str]) -> NodeView:
    """What a reservation holding ``gpus`` GPUs of ``node`` lets its jobs use: the GPUs
    its jobs hold, then free ones, up to ``gpus`` of the node's main kind."""
    units = {gpu.kind: 0 for gpu in node.gpus if not gpu.mig_mode and gpu.healthy}
    slices = {gpu.kind for gpu in node.gpus if gpu.mig_profile is not None}
    for gpu in node.gpus:
        if not gpu.mig_mode and gpu.healthy:
            units[gpu.kind] += 1
    kind = main_kind(units, slices)
    ranked = sorted((g for g in node.gpus if g.kind == kind and g.healthy and not g.mig_mode),
                    key=lambda g: (g.uuid not in mine, g.uuid in busy, g.index))
    chosen = [g for g in ranked if g.uuid in mine or g.uuid not in busy][:gpus]
    return replace(node, gpus=tuple(sorted(chosen, key=lambda g: g.index)))


def _inner_snapshot(snapshot: Snapshot, resv: AdvanceReservation, end: float,
                    live: Sequence[AdvanceReservation], jobs: list[PendingJob],
                    added: list[RunningJob]) -> Snapshot:
    """What one reservation's jobs see: its nodes (only its GPUs there), every running
    job, and the windows of other reservations on those nodes; unless it is FLEX, its
    nodes are held from the occurrence's end on, so that its jobs end by then."""
    held = dict(resv.holds)
    running = (*snapshot.running, *added)
    mine = {u for job in running if job.reservation == resv.name for u in job.gpu_uuids}
    busy = {u for job in running for u in job.gpu_uuids}
    nodes = tuple(node if held[node.name] == 0 else _view(node, held[node.name], mine, busy)
                  for node in snapshot.nodes if node.name in held)
    walls = tuple(r for r in live if r.name != resv.name and set(r.nodes) & set(held))
    if not resv.flex:
        walls = (*walls, AdvanceReservation(resv.name + "/end", end, INF,
                                            tuple((name, 0) for name in held)))
    return replace(snapshot, nodes=nodes, pending=tuple(jobs), running=running,
                   advance_reservations=walls)


def _as_running(job: PendingJob, start: Start, now: float, name: str) -> RunningJob:
    """A job started in its reservation's pass, as the pass of the other jobs sees it."""
    return RunningJob(
        job.job_id, start.node, start.gpu_uuids, job.user, job.account, job.qos,
        job.array_job_id, None if job.time_limit is None else now + job.time_limit,
        job.cpus, job.mem_mb, start.nodes, now, False, job.exclusive, start.shares,
        job.licenses, name)
