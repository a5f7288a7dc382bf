"""Job shapes (GPU types, nodes, CPUs, memory), node CPUs, memory and topology block,
and what the scheduler decided: how a job started, when a pending one is expected to.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 11:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("nodes", sa.Column("cpus", sa.Integer(), server_default=sa.text("0"), nullable=False))
    op.add_column("nodes", sa.Column("memory_mb", sa.Integer(), server_default=sa.text("0"), nullable=False))
    op.add_column("nodes", sa.Column("block", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("gpu_types", postgresql.ARRAY(sa.Text()),
                                    server_default=sa.text("'{}'"), nullable=False))
    op.add_column("jobs", sa.Column("nodes", sa.Integer(), server_default=sa.text("1"), nullable=False))
    op.add_column("jobs", sa.Column("cpus", sa.Integer(), server_default=sa.text("0"), nullable=False))
    op.add_column("jobs", sa.Column("mem_mb", sa.Integer(), server_default=sa.text("0"), nullable=False))
    op.add_column("jobs", sa.Column("start_kind", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("expected_start", sa.DateTime(timezone=True), nullable=True))
    op.add_column("jobs", sa.Column("node_names", postgresql.ARRAY(sa.Text()), nullable=True))
    op.create_check_constraint("ck_jobs_nodes", "jobs", "nodes >= 1")


def downgrade() -> None:
    """Revert this revision."""
    op.drop_constraint("ck_jobs_nodes", "jobs", type_="check")
    for column in ("node_names", "expected_start", "start_kind", "mem_mb", "cpus", "nodes",
                   "gpu_types"):
        op.drop_column("jobs", column)
    for column in ("block", "memory_mb", "cpus"):
        op.drop_column("nodes", column)
