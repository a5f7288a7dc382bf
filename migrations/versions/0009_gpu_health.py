"""GPU health: why a GPU or MIG slice is out of service and since when; whether a job
may be requeued when its GPU fails (per job, else its partition's default); the last
utilisation sample of each GPU, and each job's utilisation rolled up; signals asked
for running jobs.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("gpus", sa.Column("health_reason", sa.Text(), nullable=True))
    op.add_column("gpus", sa.Column("unhealthy_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("jobs", sa.Column("requeue", sa.Boolean(), nullable=True))
    op.add_column("jobs", sa.Column("gpu_failure", sa.Text(), nullable=True))
    op.add_column("partitions", sa.Column("requeue", sa.Boolean(),
                                          server_default=sa.text("true"), nullable=False))
    for column in ("util", "mem_used_mb", "temperature", "power_mw"):
        op.add_column("gpus", sa.Column(column, sa.Integer(), nullable=True))
    op.add_column("gpus", sa.Column("sampled_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("jobs", sa.Column("util_samples", sa.Integer(), server_default=sa.text("0"),
                                    nullable=False))
    for column in ("util_sum", "mem_sum_mb"):
        op.add_column("jobs", sa.Column(column, sa.Float(), server_default=sa.text("0"),
                                        nullable=False))
    for column in ("util_peak", "mem_peak_mb"):
        op.add_column("jobs", sa.Column(column, sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("idle_since", sa.DateTime(timezone=True), nullable=True))
    op.add_column("jobs", sa.Column("idle", sa.Boolean(), server_default=sa.text("false"),
                                    nullable=False))
    # A signal asked for (gcancel --signal) that the agent has yet to deliver.
    op.add_column("jobs", sa.Column("signal_pending", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("signal_seq", sa.Integer(), server_default=sa.text("0"),
                                    nullable=False))


def downgrade() -> None:
    """Revert this revision."""
    for column in ("signal_seq", "signal_pending", "idle", "idle_since", "mem_peak_mb", "util_peak", "mem_sum_mb", "util_sum",
                   "util_samples"):
        op.drop_column("jobs", column)
    for column in ("sampled_at", "power_mw", "temperature", "mem_used_mb", "util"):
        op.drop_column("gpus", column)
    op.drop_column("partitions", "requeue")
    op.drop_column("jobs", "gpu_failure")
    op.drop_column("jobs", "requeue")
    op.drop_column("gpus", "unhealthy_at")
    op.drop_column("gpus", "health_reason")
