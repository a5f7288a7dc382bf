"""Indexes that deleting jobs needs: ``node_commands.job_id`` (its foreign key cascades
from ``jobs``) and ``jobs.script_id`` (a script is deleted once no job names it), and
finished jobs by end time (what retention purges). Without them each job or script
deleted scans a whole table.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-28 04:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FINISHED = "state NOT IN ('PENDING', 'RUNNING')"


def upgrade() -> None:
    """Apply this revision."""
    op.create_index("ix_node_commands_job_id", "node_commands", ["job_id"])
    op.create_index("ix_jobs_script_id", "jobs", ["script_id"])
    op.create_index("ix_jobs_finished_end_time", "jobs", ["end_time"],
                    postgresql_where=sa.text(_FINISHED))


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_jobs_finished_end_time", table_name="jobs")
    op.drop_index("ix_jobs_script_id", table_name="jobs")
    op.drop_index("ix_node_commands_job_id", table_name="node_commands")
