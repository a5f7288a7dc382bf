"""What an association (a user in an account) may do at submit: which QOS it may use,
its default QOS, and how many jobs it may have queued (Slurm's association QOS list,
DefaultQOS and MaxSubmitJobs, and the QOS's MaxSubmitJobsPerUser).

A user's QOS list is their own when the admin configuration gives one, else the
nearest account's up the tree; with none anywhere it is the cluster's default QOS,
``normal``, alone. Administrators may use any QOS.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from gpusched.core.arrays import task_bounds
from gpusched.db.models import Account, AccountUser, Job, Qos
from gpusched.errors import LimitReached, UsageError

DEFAULT_QOS = "normal"
# pg_advisory_xact_lock(namespace, uid) serialises one user's submissions, so that two
# at once cannot both pass a limit that has room for one.
_SUBMIT_LOCK_NAMESPACE = 0x67737562


@dataclass(frozen=True)
class QosAccess:
    """The QOS an association may use (None: any, for administrators) and its default."""

    allowed: frozenset[str] | None
    default: str | None


def qos_access(session: Session, user: str, account: str | None, admin: bool) -> QosAccess:
    """The QOS ``user`` may use when charging ``account`` (None: no accounts configured)."""
    listed: list[str] | None = None
    default: str | None = None
    if account is not None:
        row = session.execute(select(AccountUser.qos, AccountUser.default_qos).where(
            AccountUser.user_name == user, AccountUser.account == account)).first()
        if row is not None:
            listed, default = row.qos, row.default_qos
        if listed is None or default is None:
            inherited, inherited_default = _from_accounts(session, account)
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


def _from_accounts(session: Session, account: str) -> tuple[list[str] | None, str | None]:
    """The QOS list and default of the nearest account up from ``account`` that has one."""
    rows = {name: (parent, qos, default) for name, parent, qos, default in session.execute(
        select(Account.name, Account.parent, Account.qos, Account.default_qos))}
    seen: set[str] = set()
    name: str | None = account
    while name is not None and name in rows and name not in seen:
        seen.add(name)
        parent, qos, default = rows[name]
        if qos is not None:
            return list(qos), default
        name = parent
    return None, None


def choose_qos(session: Session, requested: str | None, access: QosAccess) -> Qos | None:
    """The job's QOS row: the one requested, if the association may use it, else the
    default; None when the default does not exist (a cluster with no QOS)."""
    if requested is None:
        qos = session.get(Qos, access.default) if access.default else None
        if qos is None or access.allowed is None or qos.name in access.allowed:
            return qos
        return None
    qos = session.get(Qos, requested)
    if qos is None:
        raise UsageError(f"invalid qos specification: {requested}")
    if access.allowed is not None and qos.name not in access.allowed:
        raise UsageError(f"invalid qos specification: {requested} is not one of the QOS you "
                         f"may use ({', '.join(sorted(access.allowed)) or 'none'})")
    return qos


def _queued(session: Session, uid: int, qos: str | None = None) -> int:
    """Jobs of ``uid`` pending or running (each array task counts, started or not)."""
    conditions: list[ColumnElement[bool]] = [Job.uid == uid,
                                             Job.state.in_(("PENDING", "RUNNING"))]
    if qos is not None:
        conditions.append(Job.qos == qos)
    count, specs = session.execute(
        select(func.count().filter(Job.array_tasks.is_(None)),
               func.array_agg(Job.array_tasks).filter(Job.array_tasks.is_not(None)))
        .where(*conditions)).one()
    return int(count) + sum(task_bounds(spec)[0] for spec in specs or () if spec)


def lock_user_submits(session: Session, uid: int) -> None:
    """Hold the user's submissions lock until the transaction ends: concurrent
    submissions of one user are counted, and their submit keys looked up, in turn."""
    session.execute(text("SELECT pg_advisory_xact_lock(:space, :uid)"),
                    {"space": _SUBMIT_LOCK_NAMESPACE, "uid": uid})


def check_submit_limits(session: Session, uid: int, user: str, account: str | None,
                        qos: Qos | None, adding: int, default_limit: int | None,
                        admin: bool, locked: bool = False) -> None:
    """Refuse a submission of ``adding`` jobs that would take the user past a limit: the
    association's max_submit_jobs, the QOS's max_submit_jobs_per_user, or the cluster's
    ``default_limit`` (which administrators are not held to). The user's jobs are
    counted under lock_user_submits (taken here unless ``locked``), and only when a
    limit applies."""
    limits: list[tuple[int, str, str | None]] = []  # (most, what, QOS counted)
    if account is not None:
        most = session.scalar(select(AccountUser.max_submit_jobs).where(
            AccountUser.user_name == user, AccountUser.account == account))
        if most is not None:
            limits.append((most, f"the MaxSubmitJobs of association {user}@{account} "
                                 "[AssocMaxSubmitJobLimit]", None))
    if qos is not None and qos.max_submit_jobs_per_user is not None:
        limits.append((qos.max_submit_jobs_per_user,
                       f"the MaxSubmitJobsPerUser of QOS {qos.name} "
                       "[QOSMaxSubmitJobPerUserLimit]", qos.name))
    if default_limit is not None and not admin:
        limits.append((default_limit, "the cluster's limit per user (controller."
                                      "max_submit_jobs_per_user) [MaxSubmitJobLimit]", None))
    if limits and not locked:
        lock_user_submits(session, uid)
    counted: dict[str | None, int] = {}
    for most, what, counted_qos in sorted(limits, key=lambda limit: limit[0]):
        if counted_qos not in counted:
            counted[counted_qos] = _queued(session, uid, counted_qos)
        have = counted[counted_qos]
        if have + adding > most:
            more = "1 more job" if adding == 1 else f"{adding} more jobs"
            where = f" in QOS {counted_qos}" if counted_qos else ""
            raise LimitReached(f"job refused: user {user} has {have} jobs pending or running"
                               f"{where}; {more} would exceed the {most} allowed by {what}")
