"""GPU-hour budgets per account and per user in an account (Slurm's GrpTRESMins for
gres/gpu).

``accounts`` and ``account_users`` gain ``gpu_hours`` (the budget, NULL: none) and
``gpu_hours_period`` (``none``, ``month``, ``quarter`` or ``year``: when the usage
counted against it starts over, at the period's boundary in UTC). ``allocations``
gains an index on ``released_at``, so that the usage of a period is read from the
allocations released since it began (and those still held) alone.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-28 04:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As gpusched.core.budgets: MAX_GPU_HOURS and PERIODS.
_HOURS = "gpu_hours BETWEEN 0 AND 1000000000"
_PERIODS = "gpu_hours_period IN ('none', 'month', 'quarter', 'year')"
_TABLES = ("accounts", "account_users")


def upgrade() -> None:
    """Apply this revision."""
    for table in _TABLES:
        op.add_column(table, sa.Column("gpu_hours", sa.Float(), nullable=True))
        op.add_column(table, sa.Column("gpu_hours_period", sa.Text(), nullable=False,
                                       server_default=sa.text("'none'")))
        op.create_check_constraint(f"ck_{table}_gpu_hours", table, _HOURS)
        op.create_check_constraint(f"ck_{table}_gpu_hours_period", table, _PERIODS)
    op.create_index("ix_allocations_released_at", "allocations", ["released_at"])


def downgrade() -> None:
    """Revert this revision (the budgets are dropped)."""
    op.drop_index("ix_allocations_released_at", table_name="allocations")
    for table in _TABLES:
        for name in ("gpu_hours_period", "gpu_hours"):
            op.drop_constraint(f"ck_{table}_{name}", table, type_="check")
            op.drop_column(table, name)
