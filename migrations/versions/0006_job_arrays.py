"""Job arrays: a pending array record with its task ids, and tasks split from it.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("jobs", sa.Column("array_job_id", sa.BigInteger(), nullable=True))
    op.add_column("jobs", sa.Column("array_task_id", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("array_tasks", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("array_spec", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("array_max_running", sa.Integer(), nullable=True))
    op.create_index("ix_jobs_array_job_id", "jobs", ["array_job_id"],
                    postgresql_where=sa.text("array_job_id IS NOT NULL"))


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_jobs_array_job_id", table_name="jobs")
    for column in ("array_max_running", "array_spec", "array_tasks", "array_task_id",
                   "array_job_id"):
        op.drop_column("jobs", column)
