"""A job's request, checked against the cluster at submit (``submit_job``; a change to a
job is checked with the same rules in gpusched.db.jobupdate). The body is parsed first
(``gpusched.messages``: every field's type and bounds, no database); what needs the
database comes after. Nothing is stored unless every check passes; each refusal is one
``UsageError`` (or ``PermissionDenied``/``Conflict``) that names the field.

A submission reads what its checks need in one statement (db/submit_facts.py), after
the user's submissions lock when a submit key or a limit needs it, checks it in order
(check_submission), and stores the job in one statement more (db/submit_store.py);
through the API, once its facts are known, in one statement in all
(db/submit_known.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from sqlalchemy.orm import Session

from gpusched.core.arrays import task_bounds
from gpusched.core.licenses import format_licenses
from gpusched.core.mig_layout import MODELS as MIG_MODELS
from gpusched.core.model import Reason
from gpusched.core.timefmt import format_duration
from gpusched.core.units import kind_matches
from gpusched.db.associations import (
    NO_ASSOCIATION,
    Association,
    QosRow,
    SubmitLimit,
    access_of,
    choose_qos,
    lock_user_submits,
    queued_jobs,
    refuse_over_limits,
    submit_limits,
)
from gpusched.db.containers import check_container_nodes, stored_container
from gpusched.db.engine import driver
from gpusched.db.features import check_constraint_nodes
from gpusched.db.jobs import Identity
from gpusched.db.models import Job
from gpusched.db.reservations import check_reservation
from gpusched.db.submit_facts import (
    MIG_PARENT,
    Facts,
    PartitionRow,
    Reads,
    SessionReads,
    read_facts,
)
from gpusched.db.submit_store import KnownFacts, store_job
from gpusched.db.submitflags import check_flags
from gpusched.errors import UsageError
from gpusched.messages import UNLIMITED, JobRequest


class Submitted(NamedTuple):
    """A job stored (or found stored) by store_submission: what its caller reads."""

    id: int
    hold: str | None
    reason: str


class UnknownPartition(UsageError):
    """A partition named that does not exist."""


def _check_partition(part: PartitionRow | None, name: str | None) -> PartitionRow:
    """The partition chosen for ``name`` (None: the default), if it takes jobs."""
    if name is None:
        if part is None:
            raise UsageError("no partitions are configured")
        if part.state == "DRAIN":  # as sbatch: the default partition is not available
            raise UsageError(f"the default partition {part.name} is draining: it takes no "
                             "new jobs (name another with -p)")
        return part
    if part is None:
        raise UnknownPartition(f"invalid partition specified: {name}")
    if part.state == "INACTIVE":
        raise UsageError(f"invalid partition specified: {name}")
    if part.state == "DRAIN":
        raise UsageError(f"partition {name} is draining: it takes no new jobs")
    return part


def _choose_account(mine: dict[str, bool], anyone: bool, user: str, requested: str | None,
                    part: PartitionRow) -> str | None:
    """The account a job charges: one of the user's associations (``mine``: account,
    whether their default), their default if unnamed.

    Until an admin has configured any user associations (``anyone``), jobs charge no
    account.
    """
    if mine:
        if requested is None:
            requested = next((a for a, default in sorted(mine.items()) if default), min(mine))
        elif requested not in mine:
            raise UsageError(f"invalid account specified: user {user} may not charge account "
                             f"{requested} (theirs: {', '.join(sorted(mine))})")
    elif anyone:
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


def _check_max_wall(qos: QosRow | None, time_limit: int | None) -> None:
    if qos is not None and qos.max_wall is not None and (
            time_limit is None or time_limit > qos.max_wall):
        raise UsageError(f"time limit {format_duration(time_limit)} exceeds the MaxWall "
                         f"{format_duration(qos.max_wall)} of QOS {qos.name}")


_SHARED_BY = {"mps": "by MPS (--gres=mps:N)", "shard": "as shards (--gres=shard:N)"}


def _check_share(part: PartitionRow, mode: str | None, units: int | None) -> None:
    """A share of one GPU (``mode``, ``units``) is one ``part`` offers: its GPUs are
    shared that way, each offering at least ``units``."""
    if mode is None:
        return
    if part.sharing != mode:
        does = ("it gives whole GPUs only" if part.sharing is None
                else f"it shares them {_SHARED_BY[part.sharing]}")
        raise UsageError(f"partition {part.name} does not share GPUs "
                         f"{_SHARED_BY[mode].split(' (')[0]}: {does}")
    if units is not None and part.shares is not None and units > part.shares:
        raise UsageError(f"requested {mode}:{units}, more than the {part.shares} units each "
                         f"GPU of partition {part.name} offers")


def _could_split(units: Sequence[Sequence[Any]], kinds: tuple[str, ...]
                 ) -> list[tuple[int, int]]:
    """(count, memory MB) of the MIG slices of ``kinds`` that the GPUs split into slices
    (``units`` rows with the profile MIG_PARENT) could hold at most, as dynamic MIG may
    split them again: a profile their model has, as many as fit one GPU."""
    found = []
    for gpu_type, profile, count, _ in units:
        offered = MIG_MODELS.get(gpu_type) if profile == MIG_PARENT else None
        for kind in kinds if offered else ():
            slice_ = offered.get(kind) if offered else None
            if slice_ is not None:
                found.append((count * slice_.instances, slice_.memory_mb))
    return found


# Shapes a PartitionFacts.fits remembers at most.
_FITS_KEPT = 256


def _check_fits(part: PartitionRow, members: Sequence[Sequence[Any]], per_node: int,
                kinds: tuple[str, ...], nodes: int, cpus: int, mem_mb: int,
                nodelist: Sequence[str] = (), exclude: Sequence[str] = (),
                gpu_mem_mb: int | None = None,
                fits: dict[tuple[Any, ...], bool] | None = None) -> None:
    """Refuse a shape no set of registered nodes of ``part`` (``members``, as
    submit_facts reads them; those named, less those excluded) could ever hold;
    ``gpu_mem_mb``: GPU memory each of its GPUs needs (a GPU whose memory is not known
    may have it); ``fits``: the shapes already found to fit these members (one found
    now is added).

    A partition without registered nodes yet takes anything.
    """
    shape = (per_node, kinds, nodes, cpus, mem_mb, tuple(nodelist), tuple(exclude),
             gpu_mem_mb)
    if fits is not None and shape in fits:
        return
    if nodelist:
        outside = set(nodelist) - {name for _, name, *_ in members}
        if outside:
            raise UsageError(f"node {min(outside)} is not in partition {part.name}")
        members = [m for m in members if m[1] in nodelist]
    if exclude:
        members = [m for m in members if m[1] not in exclude]
    if not members:
        if nodelist or exclude:
            raise UsageError(f"the job excludes every node of partition {part.name}")
        return
    most = []  # per node: the most units of one matching kind
    able = 0
    memory = 0  # the most GPU memory of a matching kind
    for _, _, c, m, units in members:
        matching = [(count, gpu_mb or 0) for gpu_type, profile, count, gpu_mb in units or ()
                    if profile != MIG_PARENT
                    and kind_matches(profile or gpu_type or "gpu", profile is not None, kinds)]
        if part.dynamic_mig:  # the slices its MIG GPUs may be split into
            matching += _could_split(units or (), kinds)
        memory = max([memory, *(gpu_mb for _, gpu_mb in matching)])
        best = max((count for count, gpu_mb in matching
                    if not gpu_mem_mb or not gpu_mb or gpu_mb >= gpu_mem_mb), default=0)
        most.append(best)
        able += best >= per_node and (not c or c >= cpus) and (not m or m >= mem_mb)
    if able >= nodes:
        if fits is not None and len(fits) < _FITS_KEPT:
            fits[shape] = True
        return
    if gpu_mem_mb and memory and memory < gpu_mem_mb:
        raise UsageError(f"requested a GPU with {gpu_mem_mb} MiB of memory, but no "
                         f"{'|'.join(kinds) + ' ' if kinds else ''}GPU in partition "
                         f"{part.name} has that much (the most: {memory} MiB)")
    what = f"{per_node} {'|'.join(kinds) + ' ' if kinds else ''}GPUs"
    extra = "".join([f", {cpus} CPUs" if cpus else "", f", {mem_mb} MiB" if mem_mb else ""])
    if nodes == 1:
        raise UsageError(f"requested {what}{extra} on one node, but no node in partition "
                         f"{part.name} has that (the most: {max(most)} such GPUs)")
    raise UsageError(f"requested {nodes} nodes with {what}{extra} each, but partition "
                     f"{part.name} has only {able} such node(s)")


def _validate_time(part: PartitionRow, limit: int | str | None) -> int | None:
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


def _check_nodes_exist(request: JobRequest, known: set[str]) -> None:
    """Every node the request names or excludes is a registered node (``known``: those
    of them that are)."""
    unknown = sorted((set(request.nodelist) | set(request.exclude)) - known)
    if unknown:
        raise UsageError(f"invalid node name specified: {', '.join(unknown)}")


def _check_dependency_jobs(request: JobRequest, known: set[int]) -> None:
    """Every job the dependency names exists (``known``: those of them that do)."""
    missing = sorted(request.dependency_job_ids - known)
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
    job = session.get(Job, store_submission(session, body, who, max_submit_jobs)[0].id)
    assert job is not None
    return job


def _partition_names(text: str | None) -> list[str | None]:
    """The partitions a request asks for, in order (one None: the default)."""
    if text is None or "," not in text:
        return [text]
    return list(dict.fromkeys(n.strip() for n in text.split(",")))  # none empty (JobRequest.parse)


class Checked(NamedTuple):
    """A submission that passed the checks: the job's row (its columns and values), what
    its caller reads once it is stored, and the limits its user's queued jobs must
    leave room under (``adding`` jobs more, counted in QOS ``qos``)."""

    row: dict[str, Any]
    stored: Submitted
    limits: list[SubmitLimit]
    adding: int
    qos: str | None


def first_partition(request: JobRequest) -> str | None:
    """The partition whose facts a submission reads with the others (None: the
    default)."""
    return _partition_names(request.partition)[0]


def check_submission(request: JobRequest, who: Identity, facts: Facts, reads: Reads,
                     max_submit_jobs: int | None = None) -> Checked:
    """Every check of a parsed submission against the cluster (``facts``, and ``reads``
    for what they lack) but the count of the user's queued jobs against the limits it
    gives; the job's row to store."""
    uid, user = who.uid, who.user
    _check_nodes_exist(request, facts.known_nodes)
    reads.check_licenses(request.licenses)
    gpus, nodes, first = request.gpus, request.nodes, first_partition(request)

    def in_partition(name: str | None) -> tuple[PartitionRow, int | None, str | None]:
        chosen = facts.first if name == first else reads.partition(name)
        part = _check_partition(chosen.partition, name)
        time_limit = _validate_time(part, request.time_limit)
        if part.max_gpus_per_job is not None and gpus > part.max_gpus_per_job:
            raise UsageError(f"requested {gpus} GPUs, more than the {part.max_gpus_per_job} "
                             f"per job partition {part.name} allows")
        _check_share(part, request.share_mode, request.share)
        _check_fits(part, chosen.members, gpus // nodes, request.gpu_types, nodes,
                    request.cpus, request.mem_mb, request.nodelist, request.exclude,
                    request.gpu_mem_mb, chosen.fits)
        if request.container is not None:
            check_container_nodes(reads.session(), part.name, chosen.members,
                                  request.nodelist, request.exclude, request.container)
        if request.constraint is not None:  # sbatch: Invalid feature specification
            check_constraint_nodes(reads.session(), part.name, chosen.members,
                                   request.nodelist, request.exclude, request.constraint, nodes)
        return part, time_limit, _choose_account(facts.mine, facts.any_association, user,
                                                 request.account, part)

    part, time_limit, account = _first_partition(request.partition, in_partition)
    _check_dependency_jobs(request, facts.known_jobs)
    if request.reservation is not None:
        check_reservation(reads.session(), request.reservation, user, account,
                          (part.name, part.nodes))
    assoc = _association(reads, facts, user, account)
    qos = choose_qos(request.qos, access_of(account, assoc, who.is_admin),
                     lambda name: facts.qos[1] if name == facts.qos[0] else reads.qos(name))
    _check_max_wall(qos, time_limit)
    array = request.array_spec
    limits = submit_limits(user, account, assoc.max_submit_jobs, qos, max_submit_jobs,
                           who.is_admin)
    flag_columns = check_flags(request, who, time_limit)  # --nice, --time-min, ...
    warn = request.warn_signal
    # A held job in an open partition, with no dependency, waits for its release
    # whatever else is queued: its reason is the one a pass would give, and no pass is
    # needed for it (see needs_pass).
    held_only = request.hold and not request.dependency_text and part.state == "UP"
    stored = Submitted(0, "user" if request.hold else None,
                       Reason.JOB_HELD_USER.value if held_only else Reason.NONE.value)
    row = {
        "name": request.name, "uid": uid, "gid": who.gid, "user_name": user,
        "partition": part.name, "account": account, "qos": None if qos is None else qos.name,
        "hold": stored.hold, "begin_time": request.begin_time, "reason": stored.reason,
        "dependency": request.dependency_text, "gpus": gpus, "time_limit": time_limit,
        "work_dir": request.work_dir, "output": request.output, "error": request.error,
        "umask": request.umask, "gpu_types": list(request.gpu_types), "nodes": nodes,
        "cpus": request.cpus, "mem_mb": request.mem_mb, "nodelist": list(request.nodelist),
        # An allocation is never requeued: its client waits on this very run.
        "requeue": False if request.interactive else request.requeue,
        "interactive": request.interactive, "exclude_nodes": list(request.exclude),
        "warn_signal": None if warn is None else warn.number,
        "warn_seconds": None if warn is None else warn.seconds,
        "warn_batch_only": False if warn is None else warn.batch_only,
        "exclusive": request.exclusive, "submit_key": request.submit_key,
        "gres_flags": request.gres_flags, "share_mode": request.share_mode,
        "share_units": request.share, "gpu_mem_mb": request.gpu_mem_mb,
        "array_tasks": None if array is None else array.tasks,
        "array_spec": None if array is None else array.tasks,
        "array_max_running": None if array is None else array.max_running, **flag_columns,
        "reservation": request.reservation,
        "constraints": request.constraint,
        "licenses": format_licenses(request.licenses) or None,
        "container": stored_container(request.container),
        # The submitting user unless another is named.
        "mail_types": list(request.mail_types) or None,
        "mail_user": (request.mail_user or user) if request.mail_types else None}
    return Checked(row, stored, limits, 1 if array is None else task_bounds(array.tasks)[0],
                   None if qos is None else qos.name)


def store_submission(session: Session, body: dict[str, Any], who: Identity,
                     max_submit_jobs: int | None = None, notify: bool = False,
                     known: KnownFacts | None = None) -> tuple[Submitted, bool]:
    """submit_job's work: the job, and whether it is new (False: the user sent this
    ``submit_key`` before, and the job then stored is given; nothing else is checked).
    With ``notify``, a new job that needs a pass (see needs_pass) queues the ``sched``
    NOTIFY with its INSERT, as notify_in would. The facts read are kept in ``known``
    for the submissions after it (db/submit_store.py)."""
    request = JobRequest.parse(body)
    uid, user, keyed = who.uid, who.user, request.submit_key is not None
    # The cluster's limit holds every user but administrators: their jobs are then
    # counted (under their lock) with the facts, whatever else the checks find.
    limited = max_submit_jobs is not None and not who.is_admin
    first = first_partition(request)
    with driver(session).pipeline():  # BEGIN, the lock and the read: one round trip
        if keyed or limited:
            # Under the user's lock until the commit, read after it: their jobs counted
            # stay counted, and a copy of this submission sent to another controller at
            # once finds this job stored, or stores its own first and this one finds it;
            # the INSERT cannot meet the same key.
            lock_user_submits(session, uid)
        facts = read_facts(session, uid, user, first, request.account, request.qos,
                           set(request.nodelist) | set(request.exclude),
                           request.dependency_job_ids, request.submit_key, limited)
    if known is not None:
        known.remember(user, first, request.account, request.qos, facts)
    if facts.earlier is not None:
        return Submitted(*facts.earlier), False
    checked = check_submission(request, who, facts, SessionReads(session), max_submit_jobs)
    if checked.limits:
        if not (keyed or limited):
            lock_user_submits(session, uid)
        counted = facts.queued
        if counted is None or counted.qos != checked.qos:
            counted = queued_jobs(session, uid, checked.qos)
        refuse_over_limits(checked.limits, counted, checked.adding, user)
    job_id = store_job(session, request, checked.row,
                       "sched" if notify and needs_pass(checked.stored) else None)
    return checked.stored._replace(id=job_id), True


def _association(reads: Reads, facts: Facts, user: str,
                 account: str | None) -> Association:
    """The association a job charging ``account`` is of (read with the facts when it is
    the one they guessed)."""
    if account is None:
        return NO_ASSOCIATION
    if facts.association is not None and facts.association[0] == account:
        return facts.association[1]
    return reads.association(user, account)


T = TypeVar("T")


def needs_pass(job: Job | Submitted) -> bool:
    """Whether a pass has anything to decide about a job just stored: not about a held
    one whose reason was stored with it."""
    return not (job.hold is not None and job.reason == Reason.JOB_HELD_USER.value)


def _first_partition(text: str | None, check: Callable[[str | None], T]) -> T:
    """``check`` of the first partition of a comma list (sbatch -p a,b) that takes the
    job; when none does, the error of each. A list naming a partition that does not
    exist is refused, as sbatch refuses it, even when another would take the job."""
    if text is None or "," not in text:
        return check(text)
    errors: list[str] = []
    taken: list[T] = []
    for name in _partition_names(text):
        try:
            taken.append(check(name))
        except UnknownPartition:
            raise
        except UsageError as exc:
            errors.append(f"{name}: {exc.message}")
    if taken:
        return taken[0]
    raise UsageError(f"no partition of {text} takes the job ({'; '.join(errors)})")

