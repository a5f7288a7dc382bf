"""Node commands carry all work to agents: the flags they replace are converted and
dropped; nodes remember when the controller gave up on them.

Work in flight across the upgrade becomes commands, so jobs running through it keep
working: a started job its agent has not acknowledged gets a ``launch``, a running job
asked to stop a ``cancel``, an undelivered ``gcancel --signal`` a ``signal``, and a time
limit changed after launch a ``limit`` (the job's current limit). Then
``jobs.signal_pending``, ``signal_seq`` and ``limit_seq`` go. A node DOWN as "Not
responding" is marked lost (``nodes.lost_at``), with Slurm's reason ``NotResponding``,
so that it registers again, and has its ended runs killed, before taking work.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COMMAND = ("INSERT INTO node_commands (node_id, job_id, run, kind, payload, epoch) "
            "SELECT j.node_id, j.id, j.restarts, '{kind}', {payload}, "
            "(SELECT epoch FROM leader WHERE id = 1) FROM jobs AS j "
            "WHERE j.state = 'RUNNING' AND j.node_id IS NOT NULL AND {where} ORDER BY j.id")


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("nodes", sa.Column("lost_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE nodes SET reason = 'NotResponding', lost_at = now() "
               "WHERE state = 'DOWN' AND reason = 'Not responding'")
    for kind, payload, where in (
            ("launch", "'{}'", "j.launched_at IS NULL AND j.cancel_requested_at IS NULL"),
            ("signal", "jsonb_build_object('signal', j.signal_pending)",
             "j.signal_pending IS NOT NULL AND j.cancel_requested_at IS NULL"),
            ("limit", "jsonb_build_object('time_limit', j.time_limit)",
             "j.limit_seq > 0 AND j.launched_at IS NOT NULL AND j.cancel_requested_at IS NULL"),
            ("cancel", "'{}'", "j.cancel_requested_at IS NOT NULL")):
        op.execute(_COMMAND.format(kind=kind, payload=payload, where=where))
    op.drop_column("jobs", "signal_pending")
    op.drop_column("jobs", "signal_seq")
    op.drop_column("jobs", "limit_seq")


def downgrade() -> None:
    """Revert this revision: open signal and limit commands become flags again (launches
    and cancels were derived from launched_at and cancel_requested_at, which stay)."""
    op.add_column("jobs", sa.Column("limit_seq", sa.Integer(), server_default=sa.text("0"),
                                    nullable=False))
    op.add_column("jobs", sa.Column("signal_seq", sa.Integer(), server_default=sa.text("0"),
                                    nullable=False))
    op.add_column("jobs", sa.Column("signal_pending", sa.Integer(), nullable=True))
    op.execute(
        "UPDATE jobs AS j SET signal_pending = (c.payload->>'signal')::integer, signal_seq = 1 "
        "FROM (SELECT DISTINCT ON (job_id) job_id, run, payload FROM node_commands "
        "WHERE kind = 'signal' AND done_at IS NULL ORDER BY job_id, id DESC) AS c "
        "WHERE c.job_id = j.id AND c.run = j.restarts AND j.state = 'RUNNING'")
    op.execute(
        "UPDATE jobs AS j SET limit_seq = 1 FROM node_commands AS c "
        "WHERE c.job_id = j.id AND c.run = j.restarts AND c.kind = 'limit' "
        "AND j.state = 'RUNNING'")
    op.execute("DELETE FROM node_commands")
    op.execute("UPDATE nodes SET reason = 'Not responding' "
               "WHERE state = 'DOWN' AND reason = 'NotResponding'")
    op.drop_column("nodes", "lost_at")
