"""Idle-GPU policy: warn, then requeue or cancel jobs whose GPUs stay idle.

``partitions`` and ``qos`` gain ``idle_warn_after`` (seconds a job's GPUs stay idle
before it is warned), ``idle_action`` (``off``, ``warn``, ``requeue`` or ``cancel``)
and ``idle_action_after`` (seconds from the warning to the action); all NULL: no
policy. ``jobs`` gains ``idle_warned_at`` (the current run's warning),
``idle_action``, ``idle_action_at`` and ``idle_reason`` (what the policy did to the
job and why). ``node_commands.kind`` gains ``notice``: a line the job's supervisor
writes into the job's output file as the job's user.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_KINDS = "'launch', 'cancel', 'signal', 'limit', 'kill', 'step', 'step_cancel', 'mig'"
# Bounds of the two times (seconds): a second to 30 days, as gpusched.core.idle_policy.
_TIME = "BETWEEN 1 AND 2592000"
_ACTIONS = "'off', 'warn', 'requeue', 'cancel'"


def upgrade() -> None:
    """Apply this revision."""
    for table in ("partitions", "qos"):
        op.add_column(table, sa.Column("idle_warn_after", sa.Integer(), nullable=True))
        op.add_column(table, sa.Column("idle_action", sa.Text(), nullable=True))
        op.add_column(table, sa.Column("idle_action_after", sa.Integer(), nullable=True))
        op.create_check_constraint(f"ck_{table}_idle_warn_after", table,
                                   f"idle_warn_after {_TIME}")
        op.create_check_constraint(f"ck_{table}_idle_action_after", table,
                                   f"idle_action_after {_TIME}")
        op.create_check_constraint(f"ck_{table}_idle_action", table,
                                   f"idle_action IN ({_ACTIONS})")
    op.add_column("jobs", sa.Column("idle_warned_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("jobs", sa.Column("idle_action", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("idle_action_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("jobs", sa.Column("idle_reason", sa.Text(), nullable=True))
    op.create_check_constraint("ck_jobs_idle_action", "jobs",
                               "idle_action IN ('requeue', 'cancel')")
    op.drop_constraint("kind", "node_commands", type_="check")
    op.create_check_constraint("kind", "node_commands", f"kind IN ({_OLD_KINDS}, 'notice')")


def downgrade() -> None:
    """Revert this revision (notice commands are dropped)."""
    op.execute("DELETE FROM node_commands WHERE kind = 'notice'")
    op.drop_constraint("kind", "node_commands", type_="check")
    op.create_check_constraint("kind", "node_commands", f"kind IN ({_OLD_KINDS})")
    op.drop_constraint("ck_jobs_idle_action", "jobs", type_="check")
    for column in ("idle_reason", "idle_action_at", "idle_action", "idle_warned_at"):
        op.drop_column("jobs", column)
    for table in ("partitions", "qos"):
        for name in ("idle_action", "idle_action_after", "idle_warn_after"):
            op.drop_constraint(f"ck_{table}_{name}", table, type_="check")
        for column in ("idle_action_after", "idle_action", "idle_warn_after"):
            op.drop_column(table, column)
