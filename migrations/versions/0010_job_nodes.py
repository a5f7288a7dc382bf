"""Jobs that name their nodes (sbatch --nodelist), exclude some (--exclude) or take
them whole (--exclusive); jobs
warned by a signal before their time limit (--signal); a priority an administrator
fixed (scontrol update Priority=); and a count of time-limit changes while running.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24 16:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    for column in ("nodelist", "exclude_nodes"):
        op.add_column("jobs", sa.Column(column, postgresql.ARRAY(sa.Text()),
                                        server_default=sa.text("'{}'"), nullable=False))
    op.add_column("jobs", sa.Column("warn_signal", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("warn_seconds", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("warn_batch_only", sa.Boolean(), server_default=sa.text("false"),
                                    nullable=False))
    op.add_column("jobs", sa.Column("admin_priority", sa.Float(), nullable=True))
    op.add_column("jobs", sa.Column("exclusive", sa.Boolean(), server_default=sa.text("false"),
                                    nullable=False))
    op.add_column("jobs", sa.Column("limit_seq", sa.Integer(), server_default=sa.text("0"),
                                    nullable=False))


def downgrade() -> None:
    """Revert this revision."""
    for column in ("nodelist", "exclude_nodes", "warn_signal", "warn_seconds", "warn_batch_only",
                   "admin_priority", "limit_seq", "exclusive"):
        op.drop_column("jobs", column)
