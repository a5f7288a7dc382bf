"""Job operations for users: submit, cancel, list. Every transition is a guarded UPDATE."""

from __future__ import annotations

import json
import pwd
import signal
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import Float, Text, case, cast, func, or_, select, text, update
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from gpusched.core.arrays import ArrayError, ArraySpec, iter_tasks, parse_array, remove
from gpusched.core.capacity import kind_matches
from gpusched.core.dependency import DependencyError, parse_dependency
from gpusched.core.shapes import ShapeError, parse_kinds
from gpusched.core.signals import DEFAULT_WARN_SECONDS, MAX_WARN_SECONDS
from gpusched.core.timefmt import format_duration
from gpusched.db.engine import rowcount
from gpusched.db.models import AccountUser, Allocation, Gpu, Job, JobScript, Node, Partition, Qos
from gpusched.errors import Conflict, NotFound, PermissionDenied, UsageError

MAX_NAME = 200


@dataclass(frozen=True)
class Identity:
    """Who is asking: uid and gid from the kernel, and the user name."""

    uid: int
    gid: int
    name: str | None = None  # known already; else looked up from uid

    @property
    def user(self) -> str:
        """The login name of ``uid`` (the number itself if it has none)."""
        if self.name is not None:
            return self.name
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return str(self.uid)

    @property
    def is_admin(self) -> bool:
        """Root administers the cluster."""
        return self.uid == 0


def _field(body: dict[str, Any], key: str, kind: type, default: Any, expected: str) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise UsageError(f"{key}: expected {expected}, got {value!r}")
    return value


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


def _choose_qos(session: Session, requested: str | None, time_limit: int | None) -> str | None:
    """The job's QOS: the named one, else 'normal' when it exists, else none."""
    if requested is None:
        return "normal" if session.get(Qos, "normal") is not None else None
    qos = session.get(Qos, requested)
    if qos is None:
        raise UsageError(f"invalid qos specification: {requested}")
    if qos.max_wall is not None and (time_limit is None or time_limit > qos.max_wall):
        raise UsageError(f"time limit {format_duration(time_limit)} exceeds the MaxWall "
                         f"{format_duration(qos.max_wall)} of QOS {qos.name}")
    return qos.name


def _dependency(session: Session, text: str | None) -> str | None:
    """Validate a --dependency value: its grammar, and that the jobs it names exist."""
    if text is None or not text.strip():
        return None
    try:
        clauses = parse_dependency(text)
    except DependencyError as exc:
        raise UsageError(str(exc)) from None
    named = {j for clause in clauses for j in clause.job_ids}
    known = set(session.scalars(select(Job.id).where(Job.id.in_(named)))) if named else set()
    missing = sorted(named - known)
    if missing:
        raise UsageError(f"invalid dependency: job {missing[0]} does not exist")
    return ",".join(c.kind + "".join(f":{j}" for j in c.job_ids) for c in clauses)


def _begin_time(value: object) -> datetime | None:
    if value is None:
        return None
    expected = "an ISO 8601 time with a zone, such as 2026-12-24T18:30:00+00:00"
    if not isinstance(value, str):
        raise UsageError(f"begin_time: expected {expected}, got {value!r}")
    try:
        begin = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(f"begin_time: expected {expected}, got {value!r}") from None
    if begin.tzinfo is None:
        raise UsageError(f"begin_time: expected {expected}, got {value!r}")
    return begin


def set_hold(session: Session, job_id: int, who: Identity, hold: bool) -> Job:
    """Hold a pending job (an admin's hold is an admin hold) or release it."""
    job = _owned_job(session, job_id, who, "hold or release")
    if not hold and job.hold == "admin" and not who.is_admin:
        raise PermissionDenied(f"job {job_id} is held by an administrator; only one may release it")
    value = ("admin" if who.is_admin else "user") if hold else None
    changed = rowcount(session.execute(
        update(Job).where(Job.id == job_id, Job.state == "PENDING").values(hold=value)))
    session.refresh(job)
    if not changed:
        raise Conflict(f"job {job_id} is {job.state}: only pending jobs can be held or released")
    return job


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
    outside = set(nodelist) - set(session.scalars(query.with_only_columns(Node.name)))
    if outside:
        raise UsageError(f"node {min(outside)} is not in partition {part.name}")
    if nodelist:
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


def _names_of(body: dict[str, Any], key: str) -> list[str]:
    names = _field(body, key, list, [], "a list of node names")
    if not all(isinstance(n, str) and n for n in names):
        raise UsageError(f"{key}: expected a list of node names")
    return list(dict.fromkeys(names))


def _node_choice(session: Session, body: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The nodes a job names (it runs on exactly those) and those it excludes, each a
    registered node."""
    nodelist, exclude = _names_of(body, "nodelist"), _names_of(body, "exclude")
    named = set(nodelist) | set(exclude)
    if named:
        known = set(session.scalars(select(Node.name).where(Node.name.in_(named))))
        unknown = sorted(named - known)
        if unknown:
            raise UsageError(f"invalid node name specified: {', '.join(unknown)}")
    both = sorted(set(nodelist) & set(exclude))
    if both:
        raise UsageError(f"node {both[0]} is both named (nodelist) and excluded")
    if nodelist and body.get("nodes") is not None and body["nodes"] != len(nodelist):
        raise UsageError(f"nodes: the job names {len(nodelist)} node(s) in its nodelist, so it "
                         f"runs on {len(nodelist)}, not {body['nodes']}")
    return nodelist, exclude


def _warn_signal(body: dict[str, Any]) -> tuple[int | None, int | None, bool]:
    """``warn_signal``: {"signal": N, "seconds": S, "batch_only": B}, or null."""
    warn = _field(body, "warn_signal", dict, None, 'an object {"signal", "seconds", "batch_only"}')
    if warn is None:
        return None, None, False
    unknown = sorted(set(warn) - {"signal", "seconds", "batch_only"})
    if unknown:
        raise UsageError(f"warn_signal: unknown key {unknown[0]!r}")
    number = _field(warn, "signal", int, None, "a signal number")
    if number is None or not 1 <= number < signal.NSIG:
        raise UsageError("warn_signal.signal: expected a signal number from 1 to "
                         f"{signal.NSIG - 1}")
    seconds = _field(warn, "seconds", int, DEFAULT_WARN_SECONDS, "seconds before the time limit")
    if not 0 <= seconds <= MAX_WARN_SECONDS:
        raise UsageError(f"warn_signal.seconds: expected 0 to {MAX_WARN_SECONDS}, got {seconds}")
    return number, seconds, _field(warn, "batch_only", bool, False, "true or false")


def _warn_json(number: int | None, seconds: int | None, batch_only: bool) -> dict[str, Any] | None:
    if number is None:
        return None
    return {"signal": number, "seconds": seconds, "batch_only": batch_only}


def _shape(body: dict[str, Any], gpus: int) -> tuple[tuple[str, ...], int, int, int]:
    """GPU types, nodes, and CPUs and memory per node, validated."""
    types = _field(body, "gpu_types", list, [], "a list of GPU types or MIG profiles")
    if not all(isinstance(t, str) for t in types):
        raise UsageError("gpu_types: expected a list of GPU types or MIG profiles")
    try:
        kinds = parse_kinds("|".join(types), "gpu_types", repr(types)) if types else ()
    except ShapeError as exc:
        raise UsageError(str(exc)) from None
    nodes = _field(body, "nodes", int, 1, "a number of nodes (1 or more)")
    cpus = _field(body, "cpus", int, 0, "CPUs per node (0 or more)")
    mem_mb = _field(body, "mem_mb", int, 0, "MiB of memory per node (0 or more)")
    if nodes < 1:
        raise UsageError(f"nodes: expected a number of nodes (1 or more), got {nodes}")
    if cpus < 0 or mem_mb < 0:
        raise UsageError("cpus, mem_mb: expected 0 or more")
    if gpus % nodes:
        raise UsageError(f"gpus: {gpus} GPUs cannot be spread evenly over {nodes} nodes")
    if kinds and gpus == 0:
        raise UsageError("gpu_types: a GPU type needs a number of GPUs (--gpus TYPE:N)")
    return kinds, nodes, cpus, mem_mb


def _validate_time(part: Partition, limit: int | str | None) -> int | None:
    if limit is None:  # Slurm: DefaultTime, else MaxTime
        return part.default_time if part.default_time is not None else part.max_time
    if limit == "UNLIMITED":
        if part.max_time is not None:
            raise UsageError(f"an UNLIMITED time limit exceeds the MaxTime "
                             f"{format_duration(part.max_time)} of partition {part.name}")
        return None
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise UsageError(f"time_limit: expected seconds or \"UNLIMITED\", got {limit!r}")
    if limit <= 0:
        raise UsageError(f"time_limit: expected a positive number of seconds, got {limit}")
    if part.max_time is not None and limit > part.max_time:
        raise UsageError(
            f"time limit {format_duration(limit)} exceeds the MaxTime "
            f"{format_duration(part.max_time)} of partition {part.name}"
        )
    return limit


def submit_job(session: Session, body: dict[str, Any], who: Identity) -> Job:
    """Validate a submission and store it PENDING; nothing is stored if it is invalid."""
    script = _field(body, "script", str, None, "the batch script text")
    if script is None or not script.startswith("#!"):
        raise UsageError("This does not look like a batch script: the first line must start "
                         "with #! followed by the path to an interpreter")
    args = _field(body, "args", list, [], "a list of strings")
    if not all(isinstance(a, str) for a in args):
        raise UsageError("args: expected a list of strings")
    gpus = _field(body, "gpus", int, 0, "a whole number of GPUs (0 or more)")
    if gpus < 0:
        raise UsageError(f"gpus: expected a whole number of GPUs (0 or more), got {gpus}")
    name = _field(body, "name", str, "job", "a job name")
    if not name or len(name) > MAX_NAME or any(c in name for c in "\n\r\t"):
        raise UsageError(f"name: expected 1 to {MAX_NAME} characters without tabs or newlines")
    work_dir = _field(body, "work_dir", str, None, "an absolute directory path")
    if not work_dir or not work_dir.startswith("/"):
        raise UsageError(f"work_dir: expected an absolute directory path, got {work_dir!r}")
    env = _field(body, "environment", dict, {}, "an object of strings")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise UsageError("environment: expected an object mapping names to strings")
    output = _field(body, "output", str, None, "a file name pattern")
    error = _field(body, "error", str, None, "a file name pattern")
    nodelist, exclude = _node_choice(session, body)
    warn_number, warn_seconds, warn_batch_only = _warn_signal(body)
    if nodelist and body.get("nodes") is None:
        body = {**body, "nodes": len(nodelist)}
    kinds, nodes, cpus, mem_mb = _shape(body, gpus)
    user = who.user
    requested = _field(body, "account", str, None, "an account")

    def in_partition(name: str | None) -> tuple[Partition, int | None, str | None]:
        part = _choose_partition(session, name)
        time_limit = _validate_time(part, body.get("time_limit"))
        if part.max_gpus_per_job is not None and gpus > part.max_gpus_per_job:
            raise UsageError(f"requested {gpus} GPUs, more than the {part.max_gpus_per_job} "
                             f"per job partition {part.name} allows")
        _check_fits(session, part, gpus // nodes, kinds, nodes, cpus, mem_mb, nodelist, exclude)
        return part, time_limit, _choose_account(session, user, requested, part)

    part, time_limit, account = _first_partition(
        _field(body, "partition", str, None, "a partition name"), in_partition)
    begin = _begin_time(body.get("begin_time"))
    dependency = _dependency(session, _field(body, "dependency", str, None, "a dependency"))
    hold = "user" if _field(body, "hold", bool, False, "true or false") else None
    exclusive = _field(body, "exclusive", bool, False, "true or false")
    requeue = _field(body, "requeue", bool, None, "true, false or null")
    qos = _choose_qos(session, _field(body, "qos", str, None, "a QOS name"), time_limit)
    array = _array(_field(body, "array", str, None, "task ids such as 0-99 or 1,3,5-9%4"))
    job = Job(
        name=name, uid=who.uid, gid=who.gid, user_name=user, partition=part.name,
        account=account, qos=qos, hold=hold, begin_time=begin, dependency=dependency,
        gpus=gpus, time_limit=time_limit, work_dir=work_dir, output=output, error=error,
        payload=JobScript(script=script, args=args, environment=env),
        gpu_types=list(kinds), nodes=nodes,
        cpus=cpus, mem_mb=mem_mb, requeue=requeue, nodelist=nodelist, exclude_nodes=exclude,
        warn_signal=warn_number, warn_seconds=warn_seconds, warn_batch_only=warn_batch_only,
        exclusive=exclusive,
    )
    if array is not None:
        job.array_tasks = job.array_spec = array.tasks
        job.array_max_running = array.max_running
    session.add(job)
    session.flush()
    if array is not None:
        job.array_job_id = job.id
        session.flush()
    return job


T = TypeVar("T")


def _first_partition(text: str | None, check: Callable[[str | None], T]) -> T:
    """``check`` of the first partition of a comma list (sbatch -p a,b) that takes the
    job; when none does, the error of each."""
    if text is None or "," not in text:
        return check(text)
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise UsageError(f"partition: an empty name in {text!r}")
    errors = []
    for name in dict.fromkeys(names):
        try:
            return check(name)
        except UsageError as exc:
            errors.append(f"{name}: {exc.message}")
    raise UsageError(f"no partition of {text} takes the job ({'; '.join(errors)})")


def _array(text: str | None) -> ArraySpec | None:
    if text is None:
        return None
    try:
        return parse_array(text)
    except ArrayError as exc:
        raise UsageError(str(exc)) from None


def _owned_job(session: Session, job_id: int, who: Identity, verb: str) -> Job:
    """The job, if it exists and ``who`` may ``verb`` it (its owner or an admin)."""
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"invalid job id specified: {job_id}")
    if job.uid != who.uid and not who.is_admin:
        raise PermissionDenied(f"job {job_id} belongs to {job.user_name}; you may {verb} only "
                               f"your own jobs")
    return job


def cancel_job(session: Session, job_id: int, who: Identity) -> tuple[Job, set[str]]:
    """Cancel a job, or every task of an array; returns the job and the nodes to wake."""
    job = _owned_job(session, job_id, who, "cancel")
    now = datetime.now(UTC)
    whole_array = job.array_job_id == job.id
    ids = Job.array_job_id == job_id if whole_array else Job.id == job_id
    done = rowcount(session.execute(
        update(Job).where(ids, Job.state == "PENDING")
        .values(state="CANCELLED", end_time=now, reason="None")
    ))
    nodes = set(session.scalars(
        update(Job).where(ids, Job.state == "RUNNING", Job.cancel_requested_at.is_(None))
        .values(cancel_requested_at=now).returning(Job.node_id)))
    session.refresh(job)
    if not done and not nodes and session.scalar(
            select(Job.id).where(ids, Job.state == "RUNNING").limit(1)) is None:
        raise Conflict(f"every task of array job {job_id} has already ended" if whole_array
                       else f"job {job_id} has already ended ({job.state})")
    names = set(session.scalars(select(Node.name).where(Node.id.in_(nodes)))) if nodes else set()
    return job, names


def update_job(session: Session, job_id: int, who: Identity,
               body: dict[str, Any]) -> tuple[Job, set[str]]:
    """Change a job (scontrol update job): a pending job's time limit, partition, QOS or
    priority, or a running job's time limit. Returns the job and, for a running job,
    its nodes (their agents apply the new limit).

    Its owner may lower its time limit; an administrator may change any of them. The
    new values are checked as a submission's are.
    """
    job = _owned_job(session, job_id, who, "update")
    allowed = {"time_limit", "partition", "qos", "priority"}
    unknown = sorted(set(body) - allowed)
    if unknown or not body:
        raise UsageError(f"update: expected some of {', '.join(sorted(allowed))}"
                         + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
    if job.state == "RUNNING" and set(body) != {"time_limit"}:
        raise Conflict(f"job {job_id} is RUNNING: only its time limit can change")
    if job.state not in ("PENDING", "RUNNING"):
        raise Conflict(f"job {job_id} is {job.state}: only pending and running jobs can be "
                       "updated")
    if not who.is_admin and set(body) != {"time_limit"}:
        raise PermissionDenied("only an administrator may change a job's partition, QOS or "
                               "priority; you may lower its time limit")
    part = (_choose_partition(session, _field(body, "partition", str, None, "a partition name"))
            if "partition" in body else session.get(Partition, job.partition))
    assert part is not None
    limit = _validate_time(part, body["time_limit"]) if "time_limit" in body else job.time_limit
    if not who.is_admin and "time_limit" in body and job.time_limit is not None and (
            limit is None or limit > job.time_limit):
        raise PermissionDenied(f"only an administrator may raise a time limit (now "
                               f"{format_duration(job.time_limit)})")
    if part.max_time is not None and (limit is None or limit > part.max_time):
        raise UsageError(f"time limit {format_duration(limit)} exceeds the MaxTime "
                         f"{format_duration(part.max_time)} of partition {part.name}")
    if "partition" in body:
        _check_fits(session, part, job.gpus // max(1, job.nodes), tuple(job.gpu_types),
                    job.nodes, job.cpus, job.mem_mb, job.nodelist, job.exclude_nodes)
    qos = _choose_qos(session, _field(body, "qos", str, None, "a QOS name"), limit) \
        if "qos" in body else job.qos
    if qos is not None and "qos" not in body:
        _choose_qos(session, qos, limit)  # the MaxWall of the QOS it keeps
    priority = _priority(body) if "priority" in body else job.admin_priority
    values: dict[str, Any] = {"time_limit": limit, "partition": part.name, "qos": qos,
                              "admin_priority": priority}
    if job.state == "RUNNING":
        values = {"time_limit": limit, "limit_seq": Job.limit_seq + 1}
    changed = rowcount(session.execute(update(Job).where(Job.id == job_id, Job.state == job.state)
                                       .values(**values)))
    if not changed:
        raise Conflict(f"job {job_id} changed state while it was being updated")
    session.refresh(job)
    nodes = set(session.scalars(select(Node.name).where(Node.id == job.node_id))) \
        if job.state == "RUNNING" else set()
    return job, nodes


def _priority(body: dict[str, Any]) -> float | None:
    """``priority``: a number >= 0 that replaces the computed priority, or null to go
    back to it."""
    value = body["priority"]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 \
            or value == float("inf"):
        raise UsageError(f"priority: expected a number of 0 or more, or null, got {value!r}")
    return float(value)


def requeue_job(session: Session, job_id: int, who: Identity) -> tuple[Job, set[str]]:
    """Stop a running job and put it back in the queue with its submit time (scontrol
    requeue); returns the job and the nodes to wake."""
    job = _owned_job(session, job_id, who, "requeue")
    now = datetime.now(UTC)
    ids = Job.array_job_id == job_id if job.array_job_id == job.id else Job.id == job_id
    nodes = set(session.scalars(
        update(Job).where(ids, Job.state == "RUNNING", Job.cancel_requested_at.is_(None))
        .values(cancel_requested_at=now, preempted_at=now, preempt_mode="requeue")
        .returning(Job.node_id)))
    if not nodes:
        raise Conflict(f"job {job_id} is not running ({job.state}): only running jobs are requeued")
    return job, set(session.scalars(select(Node.name).where(Node.id.in_(nodes))))


def signal_job(session: Session, job_id: int, who: Identity, signum: int) -> tuple[Job, set[str]]:
    """Ask the agent to send ``signum`` to a running job (every task of an array) without
    ending it; returns the job and the nodes to wake."""
    if not 1 <= signum < signal.NSIG:
        raise UsageError(f"signal: expected a signal number from 1 to {signal.NSIG - 1}")
    job = _owned_job(session, job_id, who, "signal")
    ids = Job.array_job_id == job_id if job.array_job_id == job.id else Job.id == job_id
    nodes = set(session.scalars(
        update(Job).where(ids, Job.state == "RUNNING", Job.cancel_requested_at.is_(None))
        .values(signal_pending=signum, signal_seq=Job.signal_seq + 1).returning(Job.node_id)))
    if not nodes:
        raise Conflict(f"job {job_id} is not running ({job.state})")
    return job, set(session.scalars(select(Node.name).where(Node.id.in_(nodes))))


def cancel_tasks(session: Session, array_id: int, who: Identity, tasks: str
                 ) -> tuple[Job, set[str]]:
    """Cancel some tasks of array ``array_id`` (``tasks``: ids such as ``3`` or ``1-5``):
    the started ones as jobs, the pending ones by taking them out of the array's record.
    Returns the record and the nodes to wake."""
    record = _owned_job(session, array_id, who, "cancel")
    if record.array_job_id != record.id:
        raise UsageError(f"job {array_id} is not a job array: give its id alone")
    try:
        wanted = set(iter_tasks(parse_array(tasks).tasks))
    except ArrayError as exc:
        raise UsageError(f"invalid task ids {tasks!r}: {exc}") from None
    now = datetime.now(UTC)
    started = (Job.array_job_id == array_id) & Job.array_task_id.in_(wanted)
    done = rowcount(session.execute(update(Job).where(started, Job.state == "PENDING")
                                    .values(state="CANCELLED", end_time=now, reason="None")))
    nodes = set(session.scalars(
        update(Job).where(started, Job.state == "RUNNING", Job.cancel_requested_at.is_(None))
        .values(cancel_requested_at=now).returning(Job.node_id)))
    pending = record.array_tasks
    if pending is not None and wanted & set(iter_tasks(pending)):
        left = remove(pending, wanted)
        values: dict[str, Any] = {"array_tasks": left}
        if left is None:  # no task left to start: the record ends with them
            values.update(state="CANCELLED", end_time=now, reason="None")
        # Compare-and-swap on the text: a pass that started tasks meanwhile wins.
        if not rowcount(session.execute(update(Job).where(
                Job.id == array_id, Job.state == "PENDING", Job.array_tasks == pending)
                .values(**values))):
            raise Conflict(f"array job {array_id} changed while cancelling; try again")
        done += 1
    session.refresh(record)
    if not done and not nodes and session.scalar(select(Job.id).where(
            started, Job.state == "RUNNING").limit(1)) is None:
        raise Conflict(f"no task {tasks} of array job {array_id} is pending or running")
    names = set(session.scalars(select(Node.name).where(Node.id.in_(nodes)))) if nodes else set()
    return record, names


def job_placements(session: Session, jobs: Iterable[tuple[int, int | None]]
                   ) -> dict[int, tuple[str, list[str]]]:
    """Node name and GPU UUIDs (in index order) of each started job of ``jobs``, given
    as (job id, node id) pairs."""
    started = {job_id: node_id for job_id, node_id in jobs if node_id is not None}
    if not started:
        return {}
    names: dict[int, str] = dict(session.execute(select(Node.id, Node.name).where(
        Node.id.in_(set(started.values())))).all())
    placed: dict[int, tuple[str, list[str]]] = {
        job_id: (names[node_id], []) for job_id, node_id in started.items()}
    # A requeued job keeps the allocations of its earlier runs: show its latest run's.
    latest: dict[int, datetime] = {}
    rows = session.execute(
        select(Allocation.job_id, Gpu.uuid, Allocation.allocated_at)
        .join(Gpu, Gpu.id == Allocation.gpu_id)
        .where(Allocation.job_id.in_(list(placed))).order_by(Allocation.job_id, Gpu.index)
    ).all()
    for job_id, _, at in rows:
        latest[job_id] = max(at, latest.get(job_id, at))
    for job_id, uuid, at in rows:
        if at == latest[job_id]:
            placed[job_id][1].append(uuid)
    return placed


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def display_id(job_id: int, array_job: int | None, task: int | None, tasks: str | None,
               cap: int | None) -> str:
    """How squeue names a job: ``17``, an array task ``12_3``, pending tasks ``12_[4-9%2]``."""
    if array_job is None:
        return str(job_id)
    if tasks is not None:
        return f"{array_job}_[{tasks}{'' if cap is None else f'%{cap}'}]"
    return f"{array_job}_{task}"


Field = tuple[tuple[str, ...], Callable[..., Any] | None]


def _avg(total: float, count: int) -> float | None:
    return total / count if count else None


def _same(column: str) -> Field:
    return (column,), None


def _when(column: str) -> Field:
    return (column,), _iso


# The JOB object's fields (docs/api.md): the Job columns each reads, and the function
# making it from their values (None: the one column as it is). "node" and "gpu_uuids"
# come from the job's placement instead.
JOB_FIELDS: dict[str, Field] = {
    "job_id": _same("id"), "name": _same("name"), "user": _same("user_name"),
    "uid": _same("uid"), "partition": _same("partition"), "account": _same("account"),
    "qos": _same("qos"), "state": _same("state"), "reason": _same("reason"),
    "gpus": _same("gpus"), "time_limit": _same("time_limit"), "hold": _same("hold"),
    "begin_time": _when("begin_time"), "dependency": _same("dependency"),
    "submit_time": _when("submit_time"), "start_time": _when("start_time"),
    "end_time": _when("end_time"), "exit_code": _same("exit_code"),
    "signal": _same("signal"), "error_message": _same("error_message"),
    "work_dir": _same("work_dir"), "output": _same("output"), "error": _same("error"),
    "array_job_id": _same("array_job_id"), "array_task_id": _same("array_task_id"),
    "array_tasks": _same("array_tasks"), "array_max_running": _same("array_max_running"),
    "gpu_types": (("gpu_types",), list),
    "nodes": _same("nodes"), "cpus": _same("cpus"), "mem_mb": _same("mem_mb"),
    "start_kind": _same("start_kind"), "expected_start": _when("expected_start"),
    "node_names": _same("node_names"), "restarts": _same("restarts"),
    "nodelist": _same("nodelist"), "exclude": _same("exclude_nodes"),
    "warn_signal": (("warn_signal", "warn_seconds", "warn_batch_only"), _warn_json),
    "admin_priority": _same("admin_priority"), "exclusive": _same("exclusive"),
    "preempted_by": _same("preempted_by"), "requeue": _same("requeue"),
    "gpu_failure": _same("gpu_failure"),
    "gpu_util_avg": (("util_sum", "util_samples"), _avg),
    "gpu_util_peak": _same("util_peak"),
    "gpu_mem_avg_mb": (("mem_sum_mb", "util_samples"), _avg),
    "gpu_mem_peak_mb": _same("mem_peak_mb"), "gpu_samples": _same("util_samples"),
    "idle": _same("idle"), "idle_since": _when("idle_since"),
    "display_id": (("id", "array_job_id", "array_task_id", "array_tasks", "array_max_running"),
                   display_id),
}
PLACEMENT_FIELDS = ("node", "gpu_uuids")
_ALL_FIELDS = tuple(JOB_FIELDS) + PLACEMENT_FIELDS


def job_json(job: Job, placement: tuple[str, list[str]] | None, private: bool) -> dict[str, Any]:
    """The API's JOB object (docs/api.md); ``private`` adds script, args and environment."""
    node, uuids = placement if placement else (None, [])
    body: dict[str, Any] = {}
    for field, (columns, make) in JOB_FIELDS.items():
        values = [getattr(job, c) for c in columns]
        body[field] = values[0] if make is None else make(*values)
    body.update(node=node, gpu_uuids=uuids)
    if private:
        payload = job.payload
        body.update(script=payload.script, args=list(payload.args),
                    environment=dict(payload.environment))
    return body


def parse_fields(text: str) -> tuple[str, ...]:
    """``?fields=job_id,state,...``: JOB field names, checked; a usage error names an
    unknown one."""
    fields = tuple(dict.fromkeys(f.strip() for f in text.split(",") if f.strip()))
    unknown = [f for f in fields if f not in _ALL_FIELDS]
    if unknown or not fields:
        raise UsageError(f"fields: unknown JOB field {unknown[0]!r}" if unknown
                         else "fields: name at least one JOB field")
    return fields


def _iso_sql(column: Any) -> ColumnElement[str]:
    """``_iso`` in SQL: what ``datetime.isoformat()`` writes for the session's time zone
    (microseconds only when there are some); NULL stays NULL."""
    micro = case((func.extract("microseconds", column) % 1000000 == 0, ""),
                 else_=func.to_char(column, ".US"))
    return (func.to_char(column, 'YYYY-MM-DD"T"HH24:MI:SS') + micro
            + func.to_char(column, "TZH:TZM"))


def _text(column: Any) -> ColumnElement[str]:
    return cast(column, Text)


# JOB fields PostgreSQL can write as JSON exactly as job_json does (same values, same
# strings): a table of only these is built by the database as one JSON text.
# (Floats are left out: PostgreSQL writes 5.0 as 5.)
SQL_FIELDS: dict[str, Any] = {  # column expressions
    **{field: getattr(Job, columns[0]) for field, (columns, make) in JOB_FIELDS.items()
       if make is None and not isinstance(getattr(Job, columns[0]).type, Float)},
    **{field: _iso_sql(getattr(Job, columns[0])) for field, (columns, make) in JOB_FIELDS.items()
       if make is _iso},
    "gpu_types": Job.gpu_types,
    "display_id": case(
        (Job.array_job_id.is_(None), _text(Job.id)),
        (Job.array_tasks.is_not(None),
         _text(Job.array_job_id) + "_[" + Job.array_tasks
         + func.coalesce("%" + _text(Job.array_max_running), "") + "]"),
        else_=_text(Job.array_job_id) + "_" + _text(Job.array_task_id)),
    "node": Node.name,
}


def _list_filters(query: dict[str, str]) -> list[ColumnElement[bool]]:
    """The WHERE conditions of ``GET /v1/jobs``'s query parameters."""
    where: list[ColumnElement[bool]] = []
    if query.get("state"):
        where.append(Job.state.in_([s.strip().upper() for s in query["state"].split(",")]))
    elif query.get("all") not in ("1", "true", "yes"):
        where.append(Job.state.in_(["PENDING", "RUNNING"]))
    for key, column in (("user", Job.user_name), ("partition", Job.partition),
                        ("account", Job.account), ("name", Job.name)):
        if query.get(key):
            where.append(column.in_([w.strip() for w in query[key].split(",")]))
    if query.get("ids"):
        try:
            ids = [int(i) for i in query["ids"].split(",")]
        except ValueError:
            raise UsageError(f"ids: expected job ids separated by commas, got {query['ids']!r}") from None
        where.append(or_(Job.id.in_(ids), Job.array_job_id.in_(ids)))
    return where


def job_table_json(session: Session, query: dict[str, str]) -> bytes | None:
    """``GET /v1/jobs?fields=...`` as the JSON text of its answer, built by PostgreSQL
    (no Python object per job: a queue of 10,000 takes the database about 20 ms); None
    when a field asked for is not among ``SQL_FIELDS``."""
    fields = parse_fields(query["fields"])
    if not set(fields) <= SQL_FIELDS.keys():
        return None
    row = func.json_build_array(*(SQL_FIELDS[f] for f in fields))
    stmt = (select(_text(func.coalesce(func.json_agg(aggregate_order_by(row, Job.id)),
                                       text("'[]'::json"))))
            .select_from(Job).outerjoin(Node, Node.id == Job.node_id)
            .where(*_list_filters(query)))
    rows = session.connection().execute(stmt).scalar_one()
    head = json.dumps({"fields": list(fields)}, separators=(",", ":"))[:-1]
    return f'{head},"rows":{rows}}}'.encode()


def list_jobs(session: Session, query: dict[str, str]) -> dict[str, Any]:
    """The queue (or, with ``all``, every job), filtered as ``GET /v1/jobs`` describes:
    ``{"jobs": [JOB, ...]}``, or with ``fields`` a table of just those JOB fields,
    ``{"fields": [...], "rows": [[...], ...]}`` (see also ``job_table_json``)."""
    fields = parse_fields(query["fields"]) if query.get("fields") else _ALL_FIELDS
    names = list(dict.fromkeys(["id", "node_id"] + [
        c for f in fields if f in JOB_FIELDS for c in JOB_FIELDS[f][0]]))
    stmt = select(*(getattr(Job, c) for c in names)).order_by(Job.id).where(
        *_list_filters(query))
    # The driver's own tuples, not ORM objects or even Core rows, turned into the answer
    # column by column.
    result = session.connection().execute(stmt)
    found = result.cursor.fetchall()
    result.close()
    started = [(row[0], row[1]) for row in found if row[1] is not None]  # id, node_id
    if "gpu_uuids" in fields:
        placed = job_placements(session, started)
    elif "node" in fields:
        placed = _node_names(session, started)
    else:
        placed = {}
    values = dict(zip(names, zip(*found))) if found else {name: () for name in names}
    columns: list[Sequence[Any]] = []
    for field in fields:
        if field in PLACEMENT_FIELDS:
            at = 0 if field == "node" else 1
            columns.append([placed[i][at] if i in placed else (None, [])[at] for i in values["id"]])
            continue
        reads, make = JOB_FIELDS[field]
        columns.append(values[reads[0]] if make is None else
                       list(map(make, *(values[c] for c in reads))))
    rows = list(zip(*columns))
    if query.get("fields"):
        return {"fields": list(fields), "rows": rows}
    return {"jobs": [dict(zip(fields, row)) for row in rows]}


def _node_names(session: Session, started: list[tuple[int, int]]
                ) -> dict[int, tuple[str, list[str]]]:
    """The node of each started job (job id, node id), without its GPUs."""
    if not started:
        return {}
    names = dict(session.execute(select(Node.id, Node.name).where(
        Node.id.in_({node_id for _, node_id in started}))).all())
    return {job_id: (names[node_id], []) for job_id, node_id in started}


def get_job(session: Session, job_id: int, who: Identity) -> dict[str, Any]:
    """One JOB object; its owner and admins also see the script and environment."""
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"invalid job id specified: {job_id}")
    private = who.is_admin or who.uid == job.uid
    return job_json(job, job_placements(session, [(job.id, job.node_id)]).get(job_id), private)
