"""Jobs may be held (by their user or an admin) and may not begin before a time.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 08:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("jobs", sa.Column("hold", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("begin_time", sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint(op.f("ck_jobs_hold"), "jobs", "hold IN ('user', 'admin')")


def downgrade() -> None:
    """Revert this revision."""
    op.drop_constraint(op.f("ck_jobs_hold"), "jobs", type_="check")
    op.drop_column("jobs", "begin_time")
    op.drop_column("jobs", "hold")
