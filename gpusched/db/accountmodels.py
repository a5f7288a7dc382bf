"""The models of the fair-share tree and its limits: accounts, users' associations
with them, QOS, the cluster's licenses, GPU billing weights and fair-share usage (the
rest of the schema is gpusched.db.models')."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from gpusched.db.modelbase import Base, budget_checks, idle_checks


class Account(Base):
    """A node of the fair-share account tree; ``root`` has no parent."""

    __tablename__ = "accounts"
    __table_args__ = (CheckConstraint("shares >= 0", name="shares"), *budget_checks())

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    parent: Mapped[str | None] = mapped_column(ForeignKey("accounts.name", ondelete="RESTRICT"))
    shares: Mapped[int] = mapped_column(Integer, server_default=text("1"))
    # The QOS its users may use and their default, unless a user has their own; None:
    # as its parent's (the cluster's default QOS at the root).
    qos: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    default_qos: Mapped[str | None] = mapped_column(Text)
    # A GPU-hour budget (gpusched.core.budgets; None: none) and its period.
    gpu_hours: Mapped[float | None] = mapped_column(Float)
    gpu_hours_period: Mapped[str] = mapped_column(Text, server_default=text("'none'"))


class AccountUser(Base):
    """A user's association with an account (a leaf of the tree)."""

    __tablename__ = "account_users"
    __table_args__ = (CheckConstraint("shares >= 0", name="shares"), *budget_checks())

    user_name: Mapped[str] = mapped_column(Text, primary_key=True)
    account: Mapped[str] = mapped_column(ForeignKey("accounts.name", ondelete="CASCADE"),
                                         primary_key=True)
    shares: Mapped[int] = mapped_column(Integer, server_default=text("1"))
    is_default: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    qos: Mapped[list[str] | None] = mapped_column(ARRAY(Text))  # None: the account's
    default_qos: Mapped[str | None] = mapped_column(Text)
    max_submit_jobs: Mapped[int | None] = mapped_column(Integer)  # pending + running
    gpu_hours: Mapped[float | None] = mapped_column(Float)  # a GPU-hour budget, as accounts'
    gpu_hours_period: Mapped[str] = mapped_column(Text, server_default=text("'none'"))


class Qos(Base):
    """A quality of service: priority, limits and which QOS it may preempt."""

    __tablename__ = "qos"
    __table_args__ = idle_checks()

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    priority: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    max_gpus_per_user: Mapped[int | None] = mapped_column(Integer)
    max_jobs_per_user: Mapped[int | None] = mapped_column(Integer)
    grp_gpus: Mapped[int | None] = mapped_column(Integer)
    max_wall: Mapped[int | None] = mapped_column(Integer)
    preempt: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))
    max_submit_jobs_per_user: Mapped[int | None] = mapped_column(Integer)
    idle_warn_after: Mapped[int | None] = mapped_column(Integer)  # idle-GPU policy
    idle_action: Mapped[str | None] = mapped_column(Text)
    idle_action_after: Mapped[int | None] = mapped_column(Integer)


class License(Base):
    """A license of the cluster (sbatch's -L) and how many of it there are."""

    __tablename__ = "licenses"
    __table_args__ = (CheckConstraint("count >= 0", name="count"),)

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    count: Mapped[int] = mapped_column(Integer)


class GpuBilling(Base):
    """How many GPU-hours one hour on a GPU type bills in fair-share usage."""

    __tablename__ = "gpu_billing"
    __table_args__ = (CheckConstraint("weight > 0", name="weight"),)

    gpu_type: Mapped[str] = mapped_column(Text, primary_key=True)
    weight: Mapped[float] = mapped_column(Float)


class FairShareUsage(Base):
    """Decayed billed GPU-seconds of one user in one account, as of ``updated_at``."""

    __tablename__ = "fairshare_usage"

    user_name: Mapped[str] = mapped_column(Text, primary_key=True)
    account: Mapped[str] = mapped_column(Text, primary_key=True)
    usage: Mapped[float] = mapped_column(Float, server_default=text("0"))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
