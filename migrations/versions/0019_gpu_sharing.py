"""GPU sharing: a job may ask for a share of one GPU and for GPU memory, a partition
may share its GPUs, and an allocation may hold a share of a GPU.

``jobs.share_mode`` (``mps`` or ``shard``) and ``jobs.share_units`` are a share of one
GPU (``--gres=mps:N``, ``--gres=shard:N``); ``jobs.gpu_mem_mb`` the GPU memory a job
needs (``--gpu-mem``). ``partitions.sharing`` says how the partition's GPUs may be
shared (NULL: whole GPUs only) and ``partitions.shares`` how many units each offers.
``allocations.units`` and ``allocations.mem_mb`` are what a share holds (NULL units: the
GPU whole); only whole allocations stay unique per active GPU.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-10 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("jobs", sa.Column("share_mode", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("share_units", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("gpu_mem_mb", sa.Integer(), nullable=True))
    op.create_check_constraint("ck_jobs_share_mode", "jobs", "share_mode IN ('mps', 'shard')")
    op.create_check_constraint("ck_jobs_share_units", "jobs", "share_units > 0")
    op.create_check_constraint("ck_jobs_gpu_mem_mb", "jobs", "gpu_mem_mb > 0")
    op.add_column("partitions", sa.Column("sharing", sa.Text(), nullable=True))
    op.add_column("partitions", sa.Column("shares", sa.Integer(), nullable=True))
    op.create_check_constraint("ck_partitions_sharing", "partitions", "sharing IN ('mps', 'shard')")
    op.create_check_constraint("ck_partitions_shares", "partitions", "shares BETWEEN 1 AND 10000")
    op.add_column("allocations", sa.Column("units", sa.Integer(), nullable=True))
    op.add_column("allocations", sa.Column("mem_mb", sa.Integer(), nullable=True))
    op.drop_index("uq_allocations_active_gpu", table_name="allocations")
    op.create_index("uq_allocations_active_gpu", "allocations", ["gpu_id"], unique=True,
                    postgresql_where=sa.text("released_at IS NULL AND units IS NULL"))


def downgrade() -> None:
    """Revert this revision: shares still held are released (a GPU cannot be held by
    more than one job again)."""
    op.execute("UPDATE allocations SET released_at = now() "
               "WHERE released_at IS NULL AND units IS NOT NULL")
    op.drop_index("uq_allocations_active_gpu", table_name="allocations")
    op.create_index("uq_allocations_active_gpu", "allocations", ["gpu_id"], unique=True,
                    postgresql_where=sa.text("released_at IS NULL"))
    op.drop_column("allocations", "mem_mb")
    op.drop_column("allocations", "units")
    op.drop_constraint("ck_partitions_shares", "partitions", type_="check")
    op.drop_constraint("ck_partitions_sharing", "partitions", type_="check")
    op.drop_column("partitions", "shares")
    op.drop_column("partitions", "sharing")
    op.drop_constraint("ck_jobs_gpu_mem_mb", "jobs", type_="check")
    op.drop_constraint("ck_jobs_share_units", "jobs", type_="check")
    op.drop_constraint("ck_jobs_share_mode", "jobs", type_="check")
    op.drop_column("jobs", "gpu_mem_mb")
    op.drop_column("jobs", "share_units")
    op.drop_column("jobs", "share_mode")
