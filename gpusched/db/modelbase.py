"""The declarative base of the schema's models (gpusched.db.models), with stable
constraint names, and the check constraints several tables share."""

from __future__ import annotations

from sqlalchemy import CheckConstraint, MetaData
from sqlalchemy.orm import DeclarativeBase

# The idle-GPU policy of a partition or QOS (gpusched.core.idle_policy): its bounds.
_IDLE_CHECKS = ("idle_warn_after BETWEEN 1 AND 2592000", "idle_action_after BETWEEN 1 AND 2592000",
                "idle_action IN ('off', 'warn', 'requeue', 'cancel')")


def idle_checks() -> tuple[CheckConstraint, ...]:
    return tuple(CheckConstraint(check, name=check.split()[0]) for check in _IDLE_CHECKS)


# A GPU-hour budget of an account or of a user in one (gpusched.core.budgets).
_BUDGET_CHECKS = {"gpu_hours": "gpu_hours BETWEEN 0 AND 1000000000",
                  "gpu_hours_period": "gpu_hours_period IN ('none', 'month', 'quarter', 'year')"}


def budget_checks() -> tuple[CheckConstraint, ...]:
    return tuple(CheckConstraint(check, name=name) for name, check in _BUDGET_CHECKS.items())


NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def in_values(column: str, values: tuple[str, ...]) -> str:
    """A CHECK that ``column`` is one of ``values``."""
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    """Declarative base with stable constraint names (Alembic needs them)."""

    metadata = MetaData(naming_convention=NAMING)
