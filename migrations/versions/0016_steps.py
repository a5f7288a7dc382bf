"""Job steps: what ``gsrun`` starts inside a running job, node addresses, and the node
commands that start and end steps.

``job_steps`` holds one row per step (``step_id`` counts from 0 within its job):
where its tasks run (``layout``, {node: [task ids]}), what it holds on each node
(``gpus``, ``cpus``) so that concurrent steps do not share them unless ``overlap``,
its state, and, once every node has reported (``nodes_ended``, each node's outcome in
``outcomes`` in the same order), its exit code and the usage its nodes measured.
``nodes.address`` is where other nodes and clients reach a node (its agent registers
it; None: its name). ``node_commands.kind`` gains ``step`` and ``step_cancel``.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-25 18:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_KINDS = "'launch', 'cancel', 'signal', 'limit', 'kill'"
_STEP_STATES = ("'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'OUT_OF_MEMORY', "
                "'NODE_FAIL'")


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "job_steps",
        sa.Column("job_id", sa.BigInteger(), sa.ForeignKey("jobs.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("step_id", sa.Integer(), primary_key=True),
        sa.Column("run", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), server_default=sa.text("'RUNNING'"), nullable=False),
        sa.Column("uid", sa.Integer(), nullable=False),
        sa.Column("node_names", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("layout", postgresql.JSONB(), nullable=False),
        sa.Column("ntasks", sa.Integer(), nullable=False),
        sa.Column("gpus", postgresql.JSONB(), server_default=sa.text("'{}'"), nullable=False),
        sa.Column("cpus", postgresql.JSONB(), server_default=sa.text("'{}'"), nullable=False),
        sa.Column("overlap", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("cancelled", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("bad_exit", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("start_time", sa.DateTime(timezone=True), server_default=sa.func.now(),
                  nullable=False),
        sa.Column("end_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("signal", sa.Integer(), nullable=True),
        sa.Column("max_rss_bytes", sa.BigInteger(), nullable=True),
        sa.Column("cpu_usec", sa.BigInteger(), nullable=True),
        sa.Column("nodes_ended", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"),
                  nullable=False),
        sa.Column("outcomes", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"),
                  nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint(f"state IN ({_STEP_STATES})", name="state"),
        sa.CheckConstraint("step_id >= 0", name="step_id"),
        sa.CheckConstraint("ntasks > 0", name="ntasks"),
    )
    op.create_index("ix_job_steps_running", "job_steps", ["job_id"],
                    postgresql_where=sa.text("state = 'RUNNING'"))
    op.add_column("nodes", sa.Column("address", sa.Text(), nullable=True))
    op.drop_constraint("kind", "node_commands", type_="check")
    op.create_check_constraint("kind", "node_commands",
                               f"kind IN ({_OLD_KINDS}, 'step', 'step_cancel')")


def downgrade() -> None:
    """Revert this revision (steps and their commands are dropped)."""
    op.execute("DELETE FROM node_commands WHERE kind IN ('step', 'step_cancel')")
    op.drop_constraint("kind", "node_commands", type_="check")
    op.create_check_constraint("kind", "node_commands", f"kind IN ({_OLD_KINDS})")
    op.drop_column("nodes", "address")
    op.drop_index("ix_job_steps_running", table_name="job_steps")
    op.drop_table("job_steps")
