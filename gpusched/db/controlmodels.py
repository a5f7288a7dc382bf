"""Models of the controllers' own bookkeeping, beside the cluster's records in
gpusched.db.models: the leadership term, users' submission locks, and the mail outbox.
Changes go through Alembic migrations."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    Text,
    func,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from gpusched.db.modelbase import Base
from gpusched.db.modelbase import in_values as _in

MAIL_STATES = ("queued", "sending", "sent", "failed")  # of a mail_events row


class Leader(Base):
    """The one row that says which leadership term is current. A controller that becomes
    leader takes the next epoch; every transaction that applies a plan or issues node
    commands checks, holding this row, that its epoch is still the current one, so a
    deposed leader can never apply anything."""

    __tablename__ = "leader"
    __table_args__ = (CheckConstraint("id = 1", name="one_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    holder: Mapped[str | None] = mapped_column(Text)  # host:pid of the leader
    since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class UserSubmitLock(Base):
    """A user's submissions lock (db/associations.py lock_user_submits): a row per user
    that every submission updates, holding it to its commit, and whose version tells a
    submission made in one statement whether another of the user's was stored since its
    snapshot (db/submit_store.py)."""

    __tablename__ = "user_submit_locks"

    uid: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    version: Mapped[int] = mapped_column(BigInteger)


class SubmitFactsVersion(Base):
    """The version of the facts submissions check that rarely change (one row): raised
    by triggers (migration 0032) at every change of partitions, accounts, associations,
    QOS and what submissions read of nodes and GPUs. A submission checked against facts
    read before stores its job only if the version is still the one read with them
    (db/submit_store.py)."""

    __tablename__ = "submit_facts_version"
    __table_args__ = (CheckConstraint("id = 1", name="one_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    version: Mapped[int] = mapped_column(BigInteger)


class MailEvent(Base):
    """One mail about a job, recorded (its key: job, run, event) before it is sent, so
    that a failover neither loses the record nor sends it twice: ``queued`` until a
    controller claims it (``sending``, one attempt more), then ``sent``, or ``queued``
    again for a retry at ``next_attempt_at``, or ``failed`` after the last attempt."""

    __tablename__ = "mail_events"
    __table_args__ = (
        CheckConstraint(_in("state", MAIL_STATES), name="state"),
        CheckConstraint("run >= 0", name="run"),
        Index("ix_mail_events_due", "next_attempt_at", postgresql_where=text("state = 'queued'")),
    )

    job_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("jobs.id", ondelete="CASCADE"),
                                        primary_key=True)
    run: Mapped[int] = mapped_column(Integer, primary_key=True)
    event: Mapped[str] = mapped_column(Text, primary_key=True)
    recipient: Mapped[str] = mapped_column(Text)
    subject: Mapped[str] = mapped_column(Text)
    body: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(Text, server_default=text("'queued'"))
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                      server_default=func.now())
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    error: Mapped[str | None] = mapped_column(Text)
