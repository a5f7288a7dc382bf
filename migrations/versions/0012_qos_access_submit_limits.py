"""Which QOS each association may use (a list and a default, on users and on accounts
for their users to inherit), limits on the jobs a user may have queued (per
association and per QOS: Slurm's MaxSubmitJobs), and the umask a job was submitted
with.

Existing associations get no list, which means the cluster's default QOS (``normal``)
only; existing jobs get no umask, and run with 0022 as before.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    for table in ("account_users", "accounts"):
        op.add_column(table, sa.Column("qos", postgresql.ARRAY(sa.Text()), nullable=True))
        op.add_column(table, sa.Column("default_qos", sa.Text(), nullable=True))
    op.add_column("account_users", sa.Column("max_submit_jobs", sa.Integer(), nullable=True))
    op.add_column("qos", sa.Column("max_submit_jobs_per_user", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("umask", sa.Integer(), nullable=True))
    op.create_check_constraint("umask", "jobs", "umask BETWEEN 0 AND 511")


def downgrade() -> None:
    """Revert this revision."""
    op.drop_constraint("umask", "jobs", type_="check")
    op.drop_column("jobs", "umask")
    op.drop_column("qos", "max_submit_jobs_per_user")
    op.drop_column("account_users", "max_submit_jobs")
    for table in ("account_users", "accounts"):
        op.drop_column(table, "default_qos")
        op.drop_column(table, "qos")
