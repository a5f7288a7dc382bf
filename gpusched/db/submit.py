"""A job's request, validated: at submit (``submit_job``) and when it is changed
(``update_job``). Nothing is stored unless every field passes; each refusal is one
``UsageError`` (or ``PermissionDenied``/``Conflict``) that names the field."""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from gpusched.core import bounds, outputs
from gpusched.core.arrays import ArrayError, ArraySpec, parse_array, task_bounds
from gpusched.core.bounds import BoundError
from gpusched.core.capacity import kind_matches
from gpusched.core.dependency import DependencyError, parse_dependency
from gpusched.core.shapes import ShapeError, parse_kinds
from gpusched.core.signals import DEFAULT_WARN_SECONDS, MAX_WARN_SECONDS
from gpusched.core.timefmt import format_duration
from gpusched.db.associations import check_submit_limits, choose_qos, qos_access
from gpusched.db.engine import rowcount
from gpusched.db.jobs import Identity, _owned_job
from gpusched.db.models import AccountUser, Gpu, Job, JobScript, Node, Partition, Qos
from gpusched.errors import Conflict, PermissionDenied, UsageError

MAX_NAME = bounds.MAX_NAME
# The fields of POST /v1/jobs (docs/api.md); any other is refused.
SUBMIT_FIELDS = frozenset({
    "script", "args", "name", "gpus", "gpu_types", "nodes", "cpus", "mem_mb", "nodelist",
    "exclude", "warn_signal", "time_limit", "partition", "account", "qos", "hold", "exclusive",
    "requeue", "begin_time", "dependency", "array", "work_dir", "environment", "output",
    "error", "umask"})


def _shown(value: Any) -> str:
    """A value as an error message quotes it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _field(body: dict[str, Any], key: str, kind: type, default: Any, expected: str) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise UsageError(f"{key}: expected {expected}, got {_shown(value)}")
    return value


def _int_field(body: dict[str, Any], key: str, default: int, low: int, high: int,
               expected: str) -> int:
    """An integer field from ``low`` to ``high``."""
    value = _field(body, key, int, default, expected)
    try:
        return bounds.check_int(key, value, low, high, expected)
    except BoundError as exc:
        raise UsageError(str(exc)) from None


def _text_field(body: dict[str, Any], key: str, max_chars: int, expected: str) -> str | None:
    """An optional one-line printable text of at most ``max_chars`` characters."""
    value = _field(body, key, str, None, expected)
    if value is None:
        return None
    try:
        return bounds.check_text(key, value, max_chars)
    except BoundError as exc:
        raise UsageError(str(exc)) from None


def _path_field(body: dict[str, Any], key: str, expected: str) -> str | None:
    value = _field(body, key, str, None, expected)
    if value is None:
        return None
    try:
        return bounds.check_path(key, value)
    except BoundError as exc:
        raise UsageError(str(exc)) from None


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
        raise UsageError(f"begin_time: expected {expected}, got {_shown(value)}")
    try:
        begin = datetime.fromisoformat(value) if len(value) <= 64 else None
    except ValueError:
        begin = None
    if begin is None or begin.tzinfo is None:
        raise UsageError(f"begin_time: expected {expected}, got {_shown(value)}")
    return begin


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
    if len(names) > bounds.MAX_LIST:
        raise UsageError(f"{key}: more than {bounds.MAX_LIST} node names")
    if not all(isinstance(n, str) and n for n in names):
        raise UsageError(f"{key}: expected a list of node names")
    try:
        return list(dict.fromkeys(bounds.check_text(key, n, bounds.MAX_WORD) for n in names))
    except BoundError as exc:
        raise UsageError(str(exc)) from None


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


def _shape(body: dict[str, Any], gpus: int) -> tuple[tuple[str, ...], int, int, int]:
    """GPU types, nodes, and CPUs and memory per node, validated."""
    types = _field(body, "gpu_types", list, [], "a list of GPU types or MIG profiles")
    if len(types) > 64 or not all(isinstance(t, str) and len(t) <= bounds.MAX_WORD
                                  for t in types):
        raise UsageError("gpu_types: expected a list of at most 64 GPU types or MIG profiles")
    try:
        kinds = parse_kinds("|".join(types), "gpu_types", repr(types)) if types else ()
    except ShapeError as exc:
        raise UsageError(str(exc)) from None
    nodes = _int_field(body, "nodes", 1, 1, bounds.MAX_NODES, "a number of nodes")
    cpus = _int_field(body, "cpus", 0, 0, bounds.MAX_CPUS, "CPUs per node")
    mem_mb = _int_field(body, "mem_mb", 0, 0, bounds.MAX_MEM_MB, "MiB of memory per node")
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
        raise UsageError(f"time_limit: expected seconds or \"UNLIMITED\", got {_shown(limit)}")
    if not 0 < limit <= bounds.MAX_TIME_LIMIT:
        raise UsageError(f"time_limit: expected seconds from 1 to {bounds.MAX_TIME_LIMIT}, "
                         f"got {limit}")
    if part.max_time is not None and limit > part.max_time:
        raise UsageError(
            f"time limit {format_duration(limit)} exceeds the MaxTime "
            f"{format_duration(part.max_time)} of partition {part.name}"
        )
    return limit


def _request_text(body: dict[str, Any]) -> tuple[str, list[str], dict[str, str]]:
    """The script, its arguments and the environment, within their bounds."""
    script = _field(body, "script", str, None, "the batch script text")
    if script is None or not script.startswith("#!"):
        raise UsageError("This does not look like a batch script: the first line must start "
                         "with #! followed by the path to an interpreter")
    args = _field(body, "args", list, [], "a list of strings")
    if not all(isinstance(a, str) for a in args):
        raise UsageError("args: expected a list of strings")
    env = _field(body, "environment", dict, {}, "an object of strings")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise UsageError("environment: expected an object mapping names to strings")
    try:
        return bounds.check_script(script), bounds.check_args(args), bounds.check_environment(env)
    except BoundError as exc:
        raise UsageError(str(exc)) from None


def _output_pattern(body: dict[str, Any], key: str) -> str | None:
    """An output file pattern (``%j`` and friends), within its bounds."""
    pattern = _path_field(body, key, "a file name pattern")
    if pattern is not None:
        problem = outputs.output_pattern_error(pattern)
        if problem is not None:
            raise UsageError(f"{key}: {problem}")
    return pattern


def submit_job(session: Session, body: dict[str, Any], who: Identity,
               max_submit_jobs: int | None = None) -> Job:
    """Validate a submission and store it PENDING; nothing is stored if it is invalid.

    Every field is checked against its bounds before anything is looked up; the user's
    QOS access and submit limits (``max_submit_jobs``: the cluster's default per user)
    last, under a per-user lock, so that concurrent submissions cannot pass a limit.
    """
    unknown = sorted(set(body) - SUBMIT_FIELDS)
    if unknown:
        raise UsageError(f"unknown field {_shown(unknown[0])} in the submission")
    script, args, env = _request_text(body)
    gpus = _int_field(body, "gpus", 0, 0, bounds.MAX_GPUS, "a whole number of GPUs")
    name = _text_field(body, "name", MAX_NAME, "a job name") or "job"
    work_dir = _path_field(body, "work_dir", "an absolute directory path")
    if not work_dir or not work_dir.startswith("/"):
        raise UsageError(f"work_dir: expected an absolute directory path, got {_shown(work_dir)}")
    output, error = _output_pattern(body, "output"), _output_pattern(body, "error")
    umask = _int_field(body, "umask", 0, 0, 0o777, "a file mode creation mask") \
        if body.get("umask") is not None else None
    array = _array(_field(body, "array", str, None, "task ids such as 0-99 or 1,3,5-9%4"))
    requested_part = _text_field(body, "partition", bounds.PATH_MAX, "a partition name")
    requested = _text_field(body, "account", bounds.MAX_WORD, "an account")
    requested_qos = _text_field(body, "qos", bounds.MAX_WORD, "a QOS name")
    nodelist, exclude = _node_choice(session, body)
    warn_number, warn_seconds, warn_batch_only = _warn_signal(body)
    if nodelist and body.get("nodes") is None:
        body = {**body, "nodes": len(nodelist)}
    kinds, nodes, cpus, mem_mb = _shape(body, gpus)
    user = who.user

    def in_partition(name: str | None) -> tuple[Partition, int | None, str | None]:
        part = _choose_partition(session, name)
        time_limit = _validate_time(part, body.get("time_limit"))
        if part.max_gpus_per_job is not None and gpus > part.max_gpus_per_job:
            raise UsageError(f"requested {gpus} GPUs, more than the {part.max_gpus_per_job} "
                             f"per job partition {part.name} allows")
        _check_fits(session, part, gpus // nodes, kinds, nodes, cpus, mem_mb, nodelist, exclude)
        return part, time_limit, _choose_account(session, user, requested, part)

    part, time_limit, account = _first_partition(requested_part, in_partition)
    begin = _begin_time(body.get("begin_time"))
    dependency = _dependency(session, _field(body, "dependency", str, None, "a dependency"))
    hold = "user" if _field(body, "hold", bool, False, "true or false") else None
    exclusive = _field(body, "exclusive", bool, False, "true or false")
    requeue = _field(body, "requeue", bool, None, "true, false or null")
    qos = choose_qos(session, requested_qos, qos_access(session, user, account, who.is_admin))
    _check_max_wall(qos, time_limit)
    check_submit_limits(session, who.uid, user, account, qos,
                        1 if array is None else task_bounds(array.tasks)[0], max_submit_jobs,
                        who.is_admin)
    job = Job(
        name=name, uid=who.uid, gid=who.gid, user_name=user, partition=part.name,
        account=account, qos=None if qos is None else qos.name, hold=hold, begin_time=begin,
        dependency=dependency, gpus=gpus, time_limit=time_limit, work_dir=work_dir,
        output=output, error=error, umask=umask,
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


MAX_ARRAY_TEXT = 10_000  # characters of an --array value


def _array(text: str | None) -> ArraySpec | None:
    if text is None:
        return None
    if len(text) > MAX_ARRAY_TEXT:
        raise UsageError(f"array: {len(text)} characters, more than the {MAX_ARRAY_TEXT} allowed")
    try:
        return parse_array(text)
    except ArrayError as exc:
        raise UsageError(str(exc)) from None


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
    if "qos" in body:  # administrators only (above): any QOS that exists
        kept = choose_qos(session, _text_field(body, "qos", bounds.MAX_WORD, "a QOS name"),
                          qos_access(session, job.user_name, job.account, True))
    else:
        kept = session.get(Qos, job.qos) if job.qos is not None else None
    _check_max_wall(kept, limit)  # of the QOS it gets, or keeps
    qos = None if kept is None else kept.name
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