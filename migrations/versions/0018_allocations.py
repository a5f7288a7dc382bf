"""Allocations without a batch script (galloc, gsrun outside a job): ``jobs.interactive``
marks a job whose start launches nothing (its client runs steps on it and ends it), and
``jobs.client_seen`` is when that client last said it is alive; a job whose client has
been silent for ``[scheduler] allocation_grace`` is ended.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-08 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("jobs", sa.Column("interactive", sa.Boolean(), nullable=False,
                                    server_default=sa.text("false")))
    op.add_column("jobs", sa.Column("client_seen", sa.DateTime(timezone=True), nullable=True))
    # The periodic check reads the running and pending allocations only.
    op.create_index("ix_jobs_interactive_active", "jobs", ["state"],
                    postgresql_where=sa.text("interactive AND state IN ('PENDING', 'RUNNING')"))


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_jobs_interactive_active", table_name="jobs")
    op.drop_column("jobs", "client_seen")
    op.drop_column("jobs", "interactive")
