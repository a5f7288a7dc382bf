"""Cluster mode: explicit per-node commands, the leader epoch, NODE_FAIL, and a
client's submission key.

``node_commands`` carries launches, cancels, signals, time-limit changes and kills of
ended runs to each node's agent (claimed with SKIP LOCKED, stamped with the job's run
and the leader epoch); ``leader`` holds the current leadership epoch in one row;
``NODE_FAIL`` is the state of a job whose node died; ``jobs.submit_key`` makes a
submission sent twice (a lost answer, a failover) one job.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_STATES = "'PENDING', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT'"
_KINDS = "'launch', 'cancel', 'signal', 'limit', 'kill'"


def upgrade() -> None:
    """Apply this revision."""
    op.drop_constraint("state", "jobs", type_="check")
    op.create_check_constraint("state", "jobs", f"state IN ({_OLD_STATES}, 'NODE_FAIL')")
    op.add_column("jobs", sa.Column("submit_key", sa.Text(), nullable=True))
    op.create_index("ix_jobs_submit_key", "jobs", ["uid", "submit_key"], unique=True,
                    postgresql_where=sa.text("submit_key IS NOT NULL"))
    op.create_table(
        "node_commands",
        sa.Column("id", sa.BigInteger(), primary_key=True),
        sa.Column("node_id", sa.Integer(), sa.ForeignKey("nodes.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("job_id", sa.BigInteger(), sa.ForeignKey("jobs.id", ondelete="CASCADE"),
                  nullable=True),
        sa.Column("run", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(), server_default=sa.text("'{}'"),
                  nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(),
                  nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(f"kind IN ({_KINDS})", name="kind"),
        sa.CheckConstraint("run >= 0", name="run"),
    )
    op.create_index("ix_node_commands_open", "node_commands", ["node_id", "id"],
                    postgresql_where=sa.text("done_at IS NULL"))
    op.create_table(
        "leader",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("epoch", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("holder", sa.Text(), nullable=True),
        sa.Column("since", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("id = 1", name="one_row"),
    )
    op.execute("INSERT INTO leader (id, epoch) VALUES (1, 0)")


def downgrade() -> None:
    """Revert this revision (jobs that ended NODE_FAIL become FAILED)."""
    op.drop_table("leader")
    op.drop_index("ix_node_commands_open", table_name="node_commands")
    op.drop_table("node_commands")
    op.drop_index("ix_jobs_submit_key", table_name="jobs")
    op.drop_column("jobs", "submit_key")
    op.execute("UPDATE jobs SET state = 'FAILED' WHERE state = 'NODE_FAIL'")
    op.drop_constraint("state", "jobs", type_="check")
    op.create_check_constraint("state", "jobs", f"state IN ({_OLD_STATES})")
