"""Confinement: OUT_OF_MEMORY, what a job's cgroup measured, --gres-flags, how each
node confines its jobs, and drains a node's health check made.

``jobs.max_rss_bytes`` and ``jobs.cpu_usec`` are the peak memory and CPU time of the
job's last run as its cgroup counted them (None: not measured); ``jobs.gres_flags`` is
sbatch's ``--gres-flags`` (``enforce-binding`` or ``disable-binding``).
``nodes.enforced`` says whether the node's agent confines jobs in cgroups, and
``nodes.enforcement`` how (or why not); ``nodes.drained_by`` is ``health`` for a drain
the node's health check made, which its next passing check lifts.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_STATES = ("'PENDING', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', "
               "'NODE_FAIL'")


def upgrade() -> None:
    """Apply this revision."""
    op.drop_constraint("state", "jobs", type_="check")
    op.create_check_constraint("state", "jobs", f"state IN ({_OLD_STATES}, 'OUT_OF_MEMORY')")
    op.add_column("jobs", sa.Column("max_rss_bytes", sa.BigInteger(), nullable=True))
    op.add_column("jobs", sa.Column("cpu_usec", sa.BigInteger(), nullable=True))
    op.add_column("jobs", sa.Column("gres_flags", sa.Text(), nullable=True))
    op.create_check_constraint(
        "gres_flags", "jobs", "gres_flags IN ('enforce-binding', 'disable-binding')")
    op.add_column("nodes", sa.Column("enforced", sa.Boolean(), server_default=sa.text("false"),
                                     nullable=False))
    op.add_column("nodes", sa.Column("enforcement", sa.Text(), nullable=True))
    op.add_column("nodes", sa.Column("drained_by", sa.Text(), nullable=True))


def downgrade() -> None:
    """Revert this revision (jobs that ended OUT_OF_MEMORY become FAILED)."""
    op.drop_column("nodes", "drained_by")
    op.drop_column("nodes", "enforcement")
    op.drop_column("nodes", "enforced")
    op.drop_constraint("gres_flags", "jobs", type_="check")
    op.drop_column("jobs", "gres_flags")
    op.drop_column("jobs", "cpu_usec")
    op.drop_column("jobs", "max_rss_bytes")
    op.execute("UPDATE jobs SET state = 'FAILED' WHERE state = 'OUT_OF_MEMORY'")
    op.drop_constraint("state", "jobs", type_="check")
    op.create_check_constraint("state", "jobs", f"state IN ({_OLD_STATES})")
