"""Why a job waits, in words: everything that blocks it, ranked, with what would unblock it.

``explain`` runs the same pass ``plan`` runs (``SchedulingPass``), watching one job, and
turns what the pass saw when it reached that job (a ``Moment``) into sentences. The
decision itself is never made twice: the primary reason is the one the pass gave.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from gpusched.core.budgets import BudgetState
from gpusched.core.dependency import Key, dependency_clauses
from gpusched.core.licenses import license_detail
from gpusched.core.model import (
    JobState,
    PendingJob,
    Policy,
    QosLimits,
    Reason,
    Snapshot,
    Start,
)
from gpusched.core.plan import Moment, SchedulingPass, job_priorities, ordered
from gpusched.core.resvholds import reservation_detail
from gpusched.core.resvpass import plan_with_reservations
from gpusched.core.timefmt import format_duration


class NotPending(LookupError):
    """The job is not among the snapshot's pending jobs."""


@dataclass(frozen=True, slots=True)
class Blocker:
    """One thing that holds a job back, and what would release it."""

    reason: Reason
    detail: str


@dataclass(frozen=True, slots=True)
class Explanation:
    """A pending job as the pass sees it now."""

    job_id: int
    reason: Reason  # what the pass decided; NONE when it would start now
    priority: float
    position: int  # 1 for the first job in priority order
    queue_length: int
    blockers: tuple[Blocker, ...]  # most fundamental first
    starts: tuple[Start, ...]  # what this pass would start of it (an array: several tasks)


def _number(value: float) -> str:
    return f"{value:.4g}"


def _dependency_detail(moment: Moment, states: dict[Key, JobState] | None,
                       never: bool) -> str:
    job = moment.job
    parts: list[str] = []
    for clause in dependency_clauses(job.dependency or ""):
        if clause.kind == "singleton":
            parts.append(f"singleton: another job named {job.name!r} of {job.user} is running"
                         if not never else "")
            continue
        for key, _ in clause.targets():
            state = (states or {}).get(key)
            job_id = key if isinstance(key, int) else f"{key[0]}_{key[1]}"
            if state is None or not state.terminal:
                if not never:
                    parts.append(f"{clause.kind}:{job_id} waits for job {job_id} "
                                 f"({state.value if state else 'unknown'}) to "
                                 + ("begin" if clause.kind == "after" else "end"))
            elif clause.kind == "afterok" and state is not JobState.COMPLETED:
                parts.append(f"afterok:{job_id} can never be met: job {job_id} ended {state.value}")
            elif clause.kind == "afternotok" and state is JobState.COMPLETED:
                parts.append(f"afternotok:{job_id} can never be met: job {job_id} COMPLETED")
    text = "; ".join(p for p in parts if p)
    return (f"{text}: it will stay pending; cancel it (gcancel {job.job_id})" if never
            else f"{text}; it becomes eligible when that happens")


def _qos_detail(reason: Reason, moment: Moment, limits: QosLimits) -> str:
    job = moment.job
    jobs, user_gpus, account_gpus = moment.qos_held
    qos = job.qos
    if reason is Reason.QOS_MAX_JOBS_PER_USER:
        return (f"{job.user} runs {jobs} job(s) in QOS {qos}, which allows "
                f"{limits.max_jobs_per_user} per user: it starts when one of them ends")
    if reason is Reason.QOS_MAX_GPUS_PER_USER:
        limit, held, who = limits.max_gpus_per_user or 0, user_gpus, f"{job.user} holds"
        per = "per user"
    else:
        limit, held, who = limits.grp_gpus or 0, account_gpus, f"account {job.account} holds"
        per = "per account"
    room = limit - held
    unblock = (f"would start now with <= {room} GPUs" if room > 0
               else f"it starts when {held - (limit - job.gpus)} of those GPUs are released")
    return f"{who} {held} of the {limit} GPUs QOS {qos} allows {per}: {unblock}"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def _budget_detail(moment: Moment) -> str:
    """Each budget the job would exceed: what is left of it, and the largest time limit
    that would fit."""
    over = [s for s in moment.budgets if s.committed_s + s.job_s > s.budget.limit_s]
    parts = [_budget_words(state, moment.job.time_limit) for state in over or moment.budgets]
    return "; ".join(parts)


def _budget_words(state: BudgetState, time_limit: int | None) -> str:
    budget = state.budget
    period = "" if budget.period == "none" else f" this {budget.period}"
    running = max(0.0, state.committed_s - budget.used_s)
    wants = ("has no time limit, so no bound on its GPU-hours" if time_limit is None
             else f"may use up to {_hours(state.job_s)} GPU-hours "
                  f"({format_duration(time_limit)} of its time limit)")
    fits = int(state.left_s / state.gpus) if state.gpus > 0 else 0
    unblock = (f"it would start now with a time limit <= {format_duration(fits)}"
               if fits > 0 else "it starts when an administrator raises the budget or a new "
               "period begins")
    return (f"{budget.who} has {_hours(state.left_s)} of its {budget.gpu_hours:g} GPU-hours "
            f"left{period} ({_hours(budget.used_s)} used, {_hours(running)} that running "
            f"jobs may still use); the job {wants}: {unblock}")


def _detail(reason: Reason, moment: Moment, snapshot: Snapshot, now: float,
            priority: dict[int, float]) -> str:
    job = moment.job
    part = next((p for p in snapshot.partitions if p.name == job.partition), None)
    if reason in (Reason.RESERVATION, Reason.REQ_NODE_NOT_AVAIL):
        return reservation_detail(reason, job, moment.in_the_way, snapshot, now)
    if reason is Reason.PARTITION_DOWN:
        if part is None:
            return f"partition {job.partition} no longer exists: cancel the job and resubmit"
        return (f"partition {job.partition} is down: nothing in it starts until an "
                f"administrator sets it UP")
    if reason is Reason.PARTITION_TIME_LIMIT and part is not None:
        return (f"its time limit {format_duration(job.time_limit)} exceeds the MaxTime "
                f"{format_duration(part.max_time)} of partition {part.name}: it would run "
                f"with a time limit <= {format_duration(part.max_time)}")
    if reason is Reason.ACCOUNT_NOT_ALLOWED:
        return (f"partition {job.partition} does not allow account {job.account}: it would "
                f"run in another partition or under another account")
    if reason is Reason.PARTITION_CONFIG and part is not None:
        return (f"it asks for {job.gpus} GPUs, more than the {part.max_gpus_per_job} per job "
                f"partition {part.name} allows: it would run with <= {part.max_gpus_per_job}")
    if reason in (Reason.DEPENDENCY, Reason.DEPENDENCY_NEVER_SATISFIED):
        return _dependency_detail(moment, dict(snapshot.job_states),
                                  reason is Reason.DEPENDENCY_NEVER_SATISFIED)
    if reason is Reason.JOB_HELD_USER:
        return f"held by its owner: it becomes eligible after 'gcontrol release {job.job_id}'"
    if reason is Reason.JOB_HELD_ADMIN:
        return "held by an administrator: only an administrator can release it"
    if reason is Reason.BEGIN_TIME and job.begin_time is not None:
        at = datetime.fromtimestamp(job.begin_time, UTC).isoformat(timespec="seconds")
        return f"it may not start before {at}, in {format_duration(job.begin_time - now)}"
    if reason in (Reason.QOS_MAX_JOBS_PER_USER, Reason.QOS_MAX_GPUS_PER_USER, Reason.QOS_GRP_GPUS):
        return _qos_detail(reason, moment, snapshot.qos_limits.get(job.qos or "", QosLimits()))
    if reason is Reason.ASSOC_GRP_GRES_MINUTES:
        return _budget_detail(moment)
    if reason is Reason.BAD_CONSTRAINTS:
        return (f"no {job.nodes} node(s) of partition {job.partition} satisfy its constraint "
                f"({job.constraint}): it waits until nodes with those features join")
    if reason is Reason.DEADLINE:
        return ("it can no longer end by its deadline (--deadline, less its least time "
                "limit): it never runs, and ends in state DEADLINE")
    if reason is Reason.LICENSES:
        return license_detail(job.licenses, snapshot.licenses, snapshot.running)
    if reason is Reason.JOB_ARRAY_TASK_LIMIT:
        return (f"{moment.array_running} task(s) of array {job.array_job_id} run, the most its "
                f"%{job.array_max_running} allows: the next starts when one ends")
    if reason is Reason.PRIORITY and moment.in_the_way is not None:
        node, owner, start = moment.in_the_way
        room = format_duration(start - now)
        return (f"not backfilled: it has room on {node} now, but would still run when job "
                f"{owner}'s reservation starts there in {room}: it would start now with a "
                f"time limit <= {room}")
    if reason is Reason.PRIORITY:
        ahead = moment.blocked_by
        if ahead is None:
            return "this pass started as many jobs as it may; the next pass goes on"
        return (f"behind job {ahead.job_id} (priority {_number(priority[ahead.job_id])} > "
                f"{_number(priority[job.job_id])}), which waits for resources in partition "
                f"{job.partition}: jobs of a partition start in priority order")
    if reason is Reason.RESOURCES and job.exclusive:
        return (f"it takes whole nodes (--exclusive): it needs {max(1, job.nodes)} node(s) of "
                f"partition {job.partition}{_node_choice(job)} with nothing running, and "
                "fewer are idle now: it starts when enough nodes empty")
    if reason is Reason.RESOURCES and job.share:
        mode = "MPS" if job.share_mode == "mps" else "shards"
        memory = f" with {job.gpu_mem_mb} MB of its memory" if job.gpu_mem_mb else ""
        most = moment.share_room
        shared = (f"the most room on a shared GPU is {most[1]} units (on {most[0]})"
                  if most is not None else "no GPU is shared with room left")
        biggest = moment.best_free
        whole = (f"{biggest[1]} GPU(s) free on {biggest[0]}" if biggest is not None
                 and biggest[1] else "no GPU free")
        return (f"it needs {job.share} units of one GPU shared by {mode}{memory} in "
                f"partition {job.partition}{_node_choice(job)}; {shared}, {whole}"
                + ("" if job.share_mode != "mps" else
                   " (an MPS GPU serves one user's jobs at a time)")
                + ": it starts when shares end")
    if reason is Reason.RESOURCES:
        nodes = _node_choice(job)
        if moment.best_free is None:
            return f"no node of partition {job.partition} that may run its jobs is up{nodes}"
        node, free = moment.best_free
        if free == 0:
            return (f"it needs {job.gpus} GPUs on one node; every GPU of partition "
                    f"{job.partition}{nodes} is in use: it starts when GPUs are released")
        return (f"it needs {job.gpus} GPUs on one node; the most free now is {free} "
                f"(on {node}{nodes}): would start now with <= {free} GPUs")
    return reason.value


def _node_choice(job: PendingJob) -> str:
    """How the job narrowed its nodes, as words to follow a partition's name."""
    if job.nodelist:
        return f" among the nodes it named ({', '.join(job.nodelist)})"
    if job.exclude:
        return f" outside the nodes it excluded ({', '.join(job.exclude)})"
    return f" whose features satisfy {job.constraint}" if job.constraint else ""


def _fits(moment: Moment) -> bool:
    if moment.job.share:
        return moment.share_fits
    return moment.best_free is not None and moment.best_free[1] >= moment.job.gpus


def explain(snapshot: Snapshot, now: float, policy: Policy, job_id: int) -> Explanation:
    """Everything that keeps pending job ``job_id`` from starting now, ranked."""
    ranked = job_priorities(snapshot, now, policy)
    priority = {b.job_id: b.total for b in ranked}
    if job_id not in priority:
        raise NotPending(job_id)
    order = ordered(snapshot, ranked)
    if snapshot.advance_reservations:  # core/resvpass.py: the pass that plan runs then
        decided, moment = plan_with_reservations(snapshot, now, policy, watch=job_id)
    else:
        runner = SchedulingPass(snapshot, now, policy, watch=job_id)
        decided, moment = runner.run(order), runner.moment
    assert moment is not None
    reason = next((p.reason for p in decided.pending if p.job_id == job_id), Reason.NONE)
    reasons = list(moment.waits)
    if reason in (Reason.RESERVATION, Reason.REQ_NODE_NOT_AVAIL) and reason not in reasons:
        reasons.append(reason)
    if moment.blocked_by is not None or reason is Reason.PRIORITY:  # or max_starts_per_pass
        reasons.append(Reason.PRIORITY)
    # An exclusive job may find GPUs free and still wait: it needs idle nodes.
    idle_wanted = moment.job.exclusive and reason is Reason.RESOURCES
    if (not _fits(moment) or idle_wanted) and not {Reason.PARTITION_DOWN,
                                                   Reason.RESERVATION} & set(reasons):
        reasons.append(Reason.RESOURCES)
    starts = tuple(start for start in decided.starts if start.job_id == job_id)
    blockers = [Blocker(r, _detail(r, moment, snapshot, now, priority)) for r in reasons]
    if reason is not Reason.NONE and reason not in reasons:
        # An array whose first tasks start now, and whose next one met a limit or full nodes.
        blockers.append(Blocker(reason, f"{len(starts)} of its tasks start in this pass; "
                                        f"the next waits: {_LATER[reason]}"
                                if reason in _LATER else reason.value))
    return Explanation(
        job_id, reason, priority[job_id],
        next(i for i, job in enumerate(order, 1) if job.job_id == job_id), len(order),
        tuple(blockers), starts,
    )


_LATER = {
    Reason.RESOURCES: "no node has enough GPUs left for it",
    Reason.JOB_ARRAY_TASK_LIMIT: "the array's %N cap is reached",
    Reason.QOS_MAX_JOBS_PER_USER: "its QOS allows no more jobs for this user",
    Reason.QOS_MAX_GPUS_PER_USER: "its QOS allows no more GPUs for this user",
    Reason.QOS_GRP_GPUS: "its QOS allows no more GPUs for this account",
    Reason.ASSOC_GRP_GRES_MINUTES: "a GPU-hour budget has too little left for it",
    Reason.LICENSES: "its licenses are not free",
    Reason.PRIORITY: "this pass started as many jobs as it may",
}
