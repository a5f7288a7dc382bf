"""A job's request, checked against the cluster: at submit (``submit_job``) and when it is
changed (``update_job``). The body is parsed first (``gpusched.messages``: every field's
type and bounds, no database); what needs the database comes after. Nothing is stored
unless every check passes; each refusal is one ``UsageError`` (or
``PermissionDenied``/``Conflict``) that names the field."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from gpusched.core.arrays import task_bounds
from gpusched.core.model import Reason
from gpusched.core.timefmt import format_duration
from gpusched.core.units import kind_matches
from gpusched.db import steps
from gpusched.db.associations import (
    check_submit_limits,
    choose_qos,
    lock_user_submits,
    qos_access,
)
from gpusched.db.engine import rowcount
from gpusched.db.jobs import Identity, _owned_job
from gpusched.db.models import AccountUser, Gpu, Job, JobScript, Node, Partition, Qos
from gpusched.errors import Conflict, PermissionDenied, UsageError
from gpusched.messages import UNLIMITED, JobRequest, JobUpdate


def _choose_partition(session: Session, name: str | None) -> Partition:
    if name is None:
        part = session.scalars(
            select(Partition).where(Partition.state != "INACTIVE")
            .order_by(Partition.is_default.desc(), Partition.name).limit(1)
        ).first()
        if part is None:
            raise UsageError("no partitions are configured")
        return part
    part = session.get(Partition, name)
    if part is None or part.state == "INACTIVE":
        raise UsageError(f"invalid partition specified: {name}")
    if part.state == "DRAIN":
        raise UsageError(f"partition {name} is draining: it takes no new jobs")
    return part


def _choose_account(session: Session, user: str, requested: str | None, part: Partition) -> str | None:
    """The account a job charges: one of the user's associations, their default if unnamed.

    Until an admin has configured any user associations, jobs charge no account.
    """
    mine = dict(session.execute(select(AccountUser.account, AccountUser.is_default)
                                .where(AccountUser.user_name == user)).all())
    if mine:
        if requested is None:
            requested = next((a for a, default in sorted(mine.items()) if default), min(mine))
        elif requested not in mine:
            raise UsageError(f"invalid account specified: user {user} may not charge account "
                             f"{requested} (theirs: {', '.join(sorted(mine))})")
    elif session.scalar(select(AccountUser.user_name).limit(1)) is not None:
        raise UsageError(f"user {user} has no account in this cluster; ask an administrator to add one")
    elif requested is not None:
        raise UsageError(f"invalid account specified: {requested} (no accounts are configured)")
    allowed = part.allow_accounts
    if requested is not None and ((allowed is not None and requested not in allowed)
                                  or requested in part.deny_accounts):
        raise UsageError(f"partition {part.name} does not allow account {requested}")
    if requested is None and allowed is not None:
        raise UsageError(f"partition {part.name} allows only accounts {', '.join(allowed)}")
    return requested


def _check_max_wall(qos: Qos | None, time_limit: int | None) -> None:
    if qos is not None and qos.max_wall is not None and (
            time_limit is None or time_limit > qos.max_wall):
        raise UsageError(f"time limit {format_duration(time_limit)} exceeds the MaxWall "
                         f"{format_duration(qos.max_wall)} of QOS {qos.name}")


def _check_fits(session: Session, part: Partition, per_node: int, kinds: tuple[str, ...],
                nodes: int, cpus: int, mem_mb: int, nodelist: Sequence[str] = (),
                exclude: Sequence[str] = ()) -> None:
    """Refuse a shape no set of registered nodes of ``part`` (those named, less those
    excluded) could ever hold.

    A partition without registered nodes yet takes anything.
    """
    query = select(Node.id, Node.cpus, Node.memory_mb)
    if "*" not in part.nodes:
        query = query.where(Node.name.in_(part.nodes))
    if nodelist:
        outside = set(nodelist) - set(session.scalars(query.with_only_columns(Node.name)))
        if outside:
            raise UsageError(f"node {min(outside)} is not in partition {part.name}")
        query = query.where(Node.name.in_(nodelist))
    if exclude:
        query = query.where(Node.name.not_in(exclude))
    members = {nid: (c, m) for nid, c, m in session.execute(query)}
    if not members:
        if nodelist or exclude:
            raise UsageError(f"the job excludes every node of partition {part.name}")
        return
    in_mig_mode = select(Gpu.parent_id).where(Gpu.parent_id.is_not(None), Gpu.present)
    most = dict.fromkeys(members, 0)  # per node: the most units of one matching kind
    for node_id, gpu_type, profile, count in session.execute(
            select(Gpu.node_id, Gpu.gpu_type, Gpu.mig_profile, func.count())
            .where(Gpu.present, Gpu.node_id.in_(list(members)), Gpu.id.not_in(in_mig_mode))
            .group_by(Gpu.node_id, Gpu.gpu_type, Gpu.mig_profile)):
        if kind_matches(profile or gpu_type or "gpu", profile is not None, kinds):
            most[node_id] = max(most[node_id], count)
    able = [nid for nid, (c, m) in members.items()
            if most[nid] >= per_node and (not c or c >= cpus) and (not m or m >= mem_mb)]
    if len(able) >= nodes:
        return
    what = f"{per_node} {'|'.join(kinds) + ' ' if kinds else ''}GPUs"
    extra = "".join([f", {cpus} CPUs" if cpus else "", f", {mem_mb} MiB" if mem_mb else ""])
    if nodes == 1:
        raise UsageError(f"requested {what}{extra} on one node, but no node in partition "
                         f"{part.name} has that (the most: {max(most.values())} such GPUs)")
    raise UsageError(f"requested {nodes} nodes with {what}{extra} each, but partition "
                     f"{part.name} has only {len(able)} such node(s)")


def _validate_time(part: Partition, limit: int | str | None) -> int | None:
    """A parsed time limit (seconds, UNLIMITED or None) against the partition's."""
    if limit is None:  # Slurm: DefaultTime, else MaxTime
        return part.default_time if part.default_time is not None else part.max_time
    if limit == UNLIMITED or not isinstance(limit, int):
        if part.max_time is not None:
            raise UsageError(f"an UNLIMITED time limit exceeds the MaxTime "
                             f"{format_duration(part.max_time)} of partition {part.name}")
        return None
    if part.max_time is not None and limit > part.max_time:
        raise UsageError(
            f"time limit {format_duration(limit)} exceeds the MaxTime "
            f"{format_duration(part.max_time)} of partition {part.name}"
        )
    return limit


def _check_nodes_exist(session: Session, request: JobRequest) -> None:
    """Every node the request names or excludes is a registered node."""
    named = set(request.nodelist) | set(request.exclude)
    if named:
        known = set(session.scalars(select(Node.name).where(Node.name.in_(named))))
        unknown = sorted(named - known)
        if unknown:
            raise UsageError(f"invalid node name specified: {', '.join(unknown)}")


def _check_dependency_jobs(session: Session, request: JobRequest) -> None:
    """Every job the dependency names exists."""
    named = request.dependency_job_ids
    known = set(session.scalars(select(Job.id).where(Job.id.in_(named)))) if named else set()
    missing = sorted(named - known)
    if missing:
        raise UsageError(f"invalid dependency: job {missing[0]} does not exist")


def submit_job(session: Session, body: dict[str, Any], who: Identity,
               max_submit_jobs: int | None = None) -> Job:
    """Validate a submission and store it PENDING; nothing is stored if it is invalid.

    Every field is checked against its bounds (``JobRequest.parse``) before anything is
    looked up; the user's QOS access and submit limits (``max_submit_jobs``: the
    cluster's default per user) last, under a per-user lock, so that concurrent
    submissions cannot pass a limit. A submission whose ``submit_key`` this user sent
    before gives the job stored then (see store_submission).
    """
    return store_submission(session, body, who, max_submit_jobs)[0]


def submitted_before(session: Session, uid: int, submit_key: str) -> Job | None:
    """The job ``uid`` submitted with ``submit_key``, if any."""
    return session.scalars(select(Job).where(Job.uid == uid,
                                             Job.submit_key == submit_key)).first()


def store_submission(session: Session, body: dict[str, Any], who: Identity,
                     max_submit_jobs: int | None = None) -> tuple[Job, bool]:
    """submit_job's work: the job, and whether it is new (False: the user sent this
    ``submit_key`` before, and the job then stored is given; nothing else is checked)."""
    request = JobRequest.parse(body)
    if request.submit_key is not None:
        # Under the user's lock until the commit: a copy of this submission sent to
        # another controller at once finds this job stored, or stores its own first and
        # this one finds it; the INSERT below cannot meet the same key.
        lock_user_submits(session, who.uid)
        earlier = submitted_before(session, who.uid, request.submit_key)
        if earlier is not None:
            return earlier, False
    _check_nodes_exist(session, request)
    gpus, nodes, user = request.gpus, request.nodes, who.user

    def in_partition(name: str | None) -> tuple[Partition, int | None, str | None]:
        part = _choose_partition(session, name)
        time_limit = _validate_time(part, request.time_limit)
        if part.max_gpus_per_job is not None and gpus > part.max_gpus_per_job:
            raise UsageError(f"requested {gpus} GPUs, more than the {part.max_gpus_per_job} "
                             f"per job partition {part.name} allows")
        _check_fits(session, part, gpus // nodes, request.gpu_types, nodes, request.cpus,
                    request.mem_mb, request.nodelist, request.exclude)
        return part, time_limit, _choose_account(session, user, request.account, part)

    part, time_limit, account = _first_partition(request.partition, in_partition)
    _check_dependency_jobs(session, request)
    qos = choose_qos(session, request.qos, qos_access(session, user, account, who.is_admin))
    _check_max_wall(qos, time_limit)
    array = request.array_spec
    check_submit_limits(session, who.uid, user, account, qos,
                        1 if array is None else task_bounds(array.tasks)[0], max_submit_jobs,
                        who.is_admin, locked=request.submit_key is not None)
    warn = request.warn_signal
    # A held job in an open partition, with no dependency, waits for its release
    # whatever else is queued: its reason is the one a pass would give, and no pass is
    # needed for it (see needs_pass).
    held_only = request.hold and not request.dependency_text and part.state == "UP"
    job = Job(
        name=request.name, uid=who.uid, gid=who.gid, user_name=user, partition=part.name,
        account=account, qos=None if qos is None else qos.name,
        hold="user" if request.hold else None, begin_time=request.begin_time,
        reason=Reason.JOB_HELD_USER.value if held_only else Reason.NONE.value,
        dependency=request.dependency_text, gpus=gpus, time_limit=time_limit,
        work_dir=request.work_dir, output=request.output, error=request.error,
        umask=request.umask,
        payload=JobScript(script=request.script, args=list(request.args),
                          environment=dict(request.environment)),
        gpu_types=list(request.gpu_types), nodes=nodes, cpus=request.cpus,
        mem_mb=request.mem_mb, nodelist=list(request.nodelist),
        # An allocation is never requeued: its client waits on this very run.
        requeue=False if request.interactive else request.requeue,
        interactive=request.interactive,
        client_seen=func.now() if request.interactive else None,
        exclude_nodes=list(request.exclude),
        warn_signal=None if warn is None else warn.number,
        warn_seconds=None if warn is None else warn.seconds,
        warn_batch_only=False if warn is None else warn.batch_only,
        exclusive=request.exclusive, submit_key=request.submit_key,
        gres_flags=request.gres_flags,
    )
    if array is not None:
        job.array_tasks = job.array_spec = array.tasks
        job.array_max_running = array.max_running
    session.add(job)
    session.flush()
    if array is not None:
        job.array_job_id = job.id
        session.flush()
    return job, True


T = TypeVar("T")


def needs_pass(job: Job) -> bool:
    """Whether a pass has anything to decide about a job just stored: not about a held
    one whose reason was stored with it."""
    return not (job.hold is not None and job.reason == Reason.JOB_HELD_USER.value)


def _first_partition(text: str | None, check: Callable[[str | None], T]) -> T:
    """``check`` of the first partition of a comma list (sbatch -p a,b) that takes the
    job; when none does, the error of each."""
    if text is None or "," not in text:
        return check(text)
    names = [n.strip() for n in text.split(",")]  # none empty (JobRequest.parse)
    errors = []
    for name in dict.fromkeys(names):
        try:
            return check(name)
        except UsageError as exc:
            errors.append(f"{name}: {exc.message}")
    raise UsageError(f"no partition of {text} takes the job ({'; '.join(errors)})")


def update_job(session: Session, job_id: int, who: Identity,
               body: dict[str, Any]) -> tuple[Job, set[str]]:
    """Change a job (scontrol update job): a pending job's time limit, partition, QOS or
    priority, or a running job's time limit. Returns the job and, for a running job,
    its nodes (their agents apply the new limit).

    Its owner may lower its time limit; an administrator may change any of them. The
    new values are checked as a submission's are.
    """
    change = JobUpdate.parse(body)
    given = change.changes
    job = _owned_job(session, job_id, who, "update")
    if job.state == "RUNNING" and given != {"time_limit"}:
        raise Conflict(f"job {job_id} is RUNNING: only its time limit can change")
    if job.state not in ("PENDING", "RUNNING"):
        raise Conflict(f"job {job_id} is {job.state}: only pending and running jobs can be "
                       "updated")
    if not who.is_admin and given != {"time_limit"}:
        raise PermissionDenied("only an administrator may change a job's partition, QOS or "
                               "priority; you may lower its time limit")
    part = (_choose_partition(session, change.partition) if "partition" in given
            else session.get(Partition, job.partition))
    assert part is not None
    limit = _validate_time(part, change.time_limit) if "time_limit" in given \
        else job.time_limit
    if not who.is_admin and "time_limit" in given and job.time_limit is not None and (
            limit is None or limit > job.time_limit):
        raise PermissionDenied(f"only an administrator may raise a time limit (now "
                               f"{format_duration(job.time_limit)})")
    if part.max_time is not None and (limit is None or limit > part.max_time):
        raise UsageError(f"time limit {format_duration(limit)} exceeds the MaxTime "
                         f"{format_duration(part.max_time)} of partition {part.name}")
    if "partition" in given:
        _check_fits(session, part, job.gpus // max(1, job.nodes), tuple(job.gpu_types),
                    job.nodes, job.cpus, job.mem_mb, job.nodelist, job.exclude_nodes)
    if "qos" in given:  # administrators only (above): any QOS that exists
        kept = choose_qos(session, change.qos,
                          qos_access(session, job.user_name, job.account, True))
    else:
        kept = session.get(Qos, job.qos) if job.qos is not None else None
    _check_max_wall(kept, limit)  # of the QOS it gets, or keeps
    qos = None if kept is None else kept.name
    priority = change.priority if "priority" in given else job.admin_priority
    values: dict[str, Any] = {"time_limit": limit, "partition": part.name, "qos": qos,
                              "admin_priority": priority}
    if job.state == "RUNNING":
        values = {"time_limit": limit}
    changed = rowcount(session.execute(update(Job).where(Job.id == job_id, Job.state == job.state)
                                       .values(**values)))
    if not changed:
        raise Conflict(f"job {job_id} changed state while it was being updated")
    session.refresh(job)
    if job.state != "RUNNING":
        return job, set()
    # Its agents apply it: the batch node's to the batch run (a launch not yet done
    # carries it already; this is harmless), every step node's to its running steps.
    return job, steps.tell_new_limit(session, job)
