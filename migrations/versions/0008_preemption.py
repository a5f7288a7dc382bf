"""Preemption: which job a running job makes way for, how, and how often it restarted;
a requeued job may hold a GPU it held before.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("jobs", sa.Column("restarts", sa.Integer(), server_default=sa.text("0"),
                                    nullable=False))
    op.add_column("jobs", sa.Column("preempted_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("jobs", sa.Column("preempt_mode", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("preempted_by", sa.BigInteger(), nullable=True))
    # A requeued job may hold the same GPU again: each holding is its own row.
    op.drop_constraint("pk_allocations", "allocations", type_="primary")
    op.create_primary_key("pk_allocations", "allocations", ["job_id", "gpu_id", "allocated_at"])


def downgrade() -> None:
    """Revert this revision."""
    op.execute("DELETE FROM allocations a USING allocations b WHERE a.job_id = b.job_id "
               "AND a.gpu_id = b.gpu_id AND a.allocated_at < b.allocated_at")
    op.drop_constraint("pk_allocations", "allocations", type_="primary")
    op.create_primary_key("pk_allocations", "allocations", ["job_id", "gpu_id"])
    for column in ("preempted_by", "preempt_mode", "preempted_at", "restarts"):
        op.drop_column("jobs", column)
