"""What an association (a user in an account) may do at submit: which QOS it may use,
its default QOS, and how many jobs it may have queued (Slurm's association QOS list,
DefaultQOS and MaxSubmitJobs, and the QOS's MaxSubmitJobsPerUser).

A user's QOS list is their own when the admin configuration gives one, else the
nearest account's up the tree; with none anywhere it is the cluster's default QOS,
``normal``, alone. Administrators may use any QOS.

The reads are plain SQL built once, run on the driver's connection of the session's
transaction: a submission makes them, and an ORM statement costs several times the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy.orm import Session

from gpusched.db.engine import driver
from gpusched.errors import LimitReached, UsageError

DEFAULT_QOS = "normal"
# A user's submissions lock: their row of user_submit_locks, updated (and so held to
# the commit) by each of their submissions, so that two at once cannot both pass a limit
# that has room for one. Its version, as updated, is answered.
LOCK_USER = (
    "INSERT INTO user_submit_locks (uid, version) VALUES (%(uid)s, 1) ON CONFLICT (uid)"
    " DO UPDATE SET version = user_submit_locks.version + 1 RETURNING version")
# What a job of the queue counts: 1, unless it is an array's record, which counts its
# tasks still pending, read from its canonical task text (core/arrays.py: runs "a",
# "a-b" and "a-b:s", separated by commas).
_TASKS = (
    "CASE WHEN array_tasks IS NULL THEN 1 ELSE (SELECT COALESCE(sum(CASE WHEN strpos(r, '-')"
    " = 0 THEN 1 ELSE (CAST(split_part(split_part(r, ':', 1), '-', 2) AS bigint)"
    " - CAST(split_part(r, '-', 1) AS bigint))"
    " / COALESCE(CAST(NULLIF(split_part(r, ':', 2), '') AS bigint), 1) + 1 END), 0)"
    " FROM unnest(string_to_array(array_tasks, ',')) AS r) END")
# Jobs of user %(uid)s pending or running (each array task counts, started or not), as
# two numbers: [in all, in QOS {qos}].
QUEUED = (
    f"(SELECT ARRAY[COALESCE(sum({_TASKS}), 0), COALESCE(sum({_TASKS})"
    " FILTER (WHERE qos = {qos}), 0)]"
    " FROM jobs WHERE uid = %(uid)s AND state IN ('PENDING', 'RUNNING'))")
_QUEUED = "SELECT " + QUEUED.format(qos="CAST(%(qos)s AS text)")
# The accounts tree, as JSON [name, parent, qos, default_qos] rows (NULL when empty).
ACCOUNT_TREE = ("(SELECT json_agg(json_build_array(name, parent, qos, default_qos)"
                " ORDER BY name) FROM accounts)")
# A user's association with an account (NULLs when none): its QOS list, default QOS and
# MaxSubmitJobs, and the accounts tree when the QOS list or default is inherited.
_ASSOCIATION = (
    "SELECT au.qos, au.default_qos, au.max_submit_jobs, CASE WHEN au.qos IS NULL"
    f" OR au.default_qos IS NULL THEN {ACCOUNT_TREE} END"
    " FROM (SELECT) AS one LEFT JOIN account_users AS au"
    " ON au.user_name = %(user)s AND au.account = %(account)s")
_QOS = "SELECT name, max_wall, max_submit_jobs_per_user FROM qos WHERE name = %(name)s"


class QosRow(NamedTuple):
    """What a submission reads of a QOS."""

    name: str
    max_wall: int | None
    max_submit_jobs_per_user: int | None


class Association(NamedTuple):
    """A user's association with an account as a submission reads it: its own QOS list
    and default (None: inherited), its MaxSubmitJobs, and the accounts tree as
    [name, parent, qos, default_qos] rows when the list or default is inherited."""

    qos: list[str] | None
    default_qos: str | None
    max_submit_jobs: int | None
    tree: Sequence[Sequence[Any]] | None


NO_ASSOCIATION = Association(None, None, None, None)


@dataclass(frozen=True)
class QosAccess:
    """The QOS an association may use (None: any, for administrators) and its default."""

    allowed: frozenset[str] | None
    default: str | None


def association(session: Session, user: str, account: str) -> Association:
    """``user``'s association with ``account``, as ``access_of`` wants it."""
    return Association(*driver(session).execute(_ASSOCIATION, {
        "user": user, "account": account}).fetchone())


def qos_access(session: Session, user: str, account: str | None, admin: bool) -> QosAccess:
    """The QOS ``user`` may use when charging ``account`` (None: no accounts configured)."""
    return access_of(account, NO_ASSOCIATION if account is None
                     else association(session, user, account), admin)


def access_of(account: str | None, row: Association, admin: bool) -> QosAccess:
    """qos_access, from the association's row (as ``association`` reads it)."""
    listed: list[str] | None = None
    default: str | None = None
    if account is not None:
        listed, default = row.qos, row.default_qos
        if listed is None or default is None:
            inherited, inherited_default = _from_accounts(row.tree or (), account)
            if listed is None:
                listed = inherited
                default = default or inherited_default
    if default is None and listed:
        default = DEFAULT_QOS if DEFAULT_QOS in listed else listed[0]
    if default is None:
        default = DEFAULT_QOS
    if admin:
        return QosAccess(None, default)
    return QosAccess(frozenset(listed) if listed is not None else frozenset({DEFAULT_QOS}),
                     default)


def _from_accounts(tree: Sequence[Sequence[Any]],
                   account: str) -> tuple[list[str] | None, str | None]:
    """The QOS list and default of the nearest account up from ``account`` that has one."""
    rows = {name: (parent, qos, default) for name, parent, qos, default in tree}
    seen: set[str] = set()
    name: str | None = account
    while name is not None and name in rows and name not in seen:
        seen.add(name)
        parent, qos, default = rows[name]
        if qos is not None:
            return list(qos), default
        name = parent
    return None, None


def qos_row(session: Session, name: str) -> QosRow | None:
    """The QOS named ``name``, if it exists."""
    row = driver(session).execute(_QOS, {"name": name}).fetchone()
    return None if row is None else QosRow(*row)


def choose_qos(requested: str | None, access: QosAccess,
               find: Callable[[str], QosRow | None]) -> QosRow | None:
    """The job's QOS (``find`` reads one by name): the one requested, if the association
    may use it, else the default; None when the default does not exist (a cluster with
    no QOS)."""
    if requested is None:
        qos = find(access.default) if access.default else None
        if qos is None or access.allowed is None or qos.name in access.allowed:
            return qos
        return None
    qos = find(requested)
    if qos is None:
        raise UsageError(f"invalid qos specification: {requested}")
    if access.allowed is not None and qos.name not in access.allowed:
        raise UsageError(f"invalid qos specification: {requested} is not one of the QOS you "
                         f"may use ({', '.join(sorted(access.allowed)) or 'none'})")
    return qos


class Queued(NamedTuple):
    """Jobs of a user pending or running (each array task counts, started or not): in
    all, and in QOS ``qos``."""

    qos: str | None
    in_all: int
    in_qos: int


def queued(qos: str | None, counted: Sequence[Any]) -> Queued:
    """Queued, from what QUEUED reads for ``qos``."""
    in_all, in_qos = counted
    return Queued(qos, int(in_all), int(in_qos))


def queued_jobs(session: Session, uid: int, qos: str | None) -> Queued:
    """The user's queued jobs (read under their lock), in all and in QOS ``qos``."""
    return queued(qos, driver(session).execute(_QUEUED, {"uid": uid, "qos": qos}).fetchone()[0])


def lock_user_submits(session: Session, uid: int) -> None:
    """Hold the user's submissions lock until the transaction ends: concurrent
    submissions of one user are counted, and their submit keys looked up, in turn."""
    driver(session).execute(LOCK_USER, {"uid": uid})


class SubmitLimit(NamedTuple):
    """A most of queued jobs a submission may not pass: what it is, and the QOS whose
    jobs it counts (None: all the user's)."""

    most: int
    what: str
    qos: str | None


def submit_limits(user: str, account: str | None, association_limit: int | None,
                  qos: QosRow | None, default_limit: int | None,
                  admin: bool) -> list[SubmitLimit]:
    """The limits on a submission's queued jobs: the association's max_submit_jobs
    (``association_limit``, read with the association), the QOS's
    max_submit_jobs_per_user, and the cluster's ``default_limit`` (which administrators
    are not held to); the lowest first."""
    limits: list[SubmitLimit] = []
    if account is not None and association_limit is not None:
        limits.append(SubmitLimit(association_limit, f"the MaxSubmitJobs of association "
                                  f"{user}@{account} [AssocMaxSubmitJobLimit]", None))
    if qos is not None and qos.max_submit_jobs_per_user is not None:
        limits.append(SubmitLimit(qos.max_submit_jobs_per_user,
                                  f"the MaxSubmitJobsPerUser of QOS {qos.name} "
                                  "[QOSMaxSubmitJobPerUserLimit]", qos.name))
    if default_limit is not None and not admin:
        limits.append(SubmitLimit(default_limit, "the cluster's limit per user (controller."
                                  "max_submit_jobs_per_user) [MaxSubmitJobLimit]", None))
    return sorted(limits, key=lambda limit: limit.most)


def refuse_over_limits(limits: Sequence[SubmitLimit], counted: Queued, adding: int,
                       user: str) -> None:
    """Refuse ``adding`` jobs more when the user's queued jobs (``counted``, in the QOS
    of the limits that count one QOS) would pass one of ``limits``."""
    for most, what, counted_qos in limits:
        have = counted.in_all if counted_qos is None else counted.in_qos
        if have + adding > most:
            more = "1 more job" if adding == 1 else f"{adding} more jobs"
            where = f" in QOS {counted_qos}" if counted_qos else ""
            raise LimitReached(f"job refused: user {user} has {have} jobs pending or running"
                               f"{where}; {more} would exceed the {most} allowed by {what}")


def check_submit_limits(session: Session, uid: int, user: str, account: str | None,
                        association_limit: int | None, qos: QosRow | None, adding: int,
                        default_limit: int | None, admin: bool, locked: bool = False,
                        counted: Queued | None = None) -> None:
    """Refuse a submission of ``adding`` jobs that would take the user past a limit
    (submit_limits). The user's jobs are counted under lock_user_submits (taken here
    unless ``locked``), and only when a limit applies; ``counted``: as counted already
    under the lock (used unless of another QOS)."""
    limits = submit_limits(user, account, association_limit, qos, default_limit, admin)
    if not limits:
        return
    if not locked:
        lock_user_submits(session, uid)
    if counted is None or (qos is not None and qos.name != counted.qos):
        counted = queued_jobs(session, uid, None if qos is None else qos.name)
    refuse_over_limits(limits, counted, adding, user)
