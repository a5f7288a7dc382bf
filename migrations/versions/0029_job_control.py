"""Job control: suspended jobs and ``gcontrol top``.

A running job suspended by an administrator (``gcontrol suspend``) keeps its state
RUNNING and its GPUs; ``jobs.suspended_at`` says since when it is suspended (NULL: it
is not) and ``jobs.suspended_seconds`` how long its current run was suspended before,
which its time limit and run time do not count. ``jobs.top_rank`` orders the jobs a
user moved to the top of their own queue (higher: moved later, so first); NULL: not
moved. ``node_commands.kind`` gains ``suspend``: stop (or continue) every process of a
job on a node.

Revision ID: 0029
Revises: 0028
Create Date: 2026-11-28 07:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_KINDS = ("'launch', 'cancel', 'signal', 'limit', 'kill', 'step', 'step_cancel', 'mig', "
              "'notice'")


# Whether an array's pending task text (canonical: 3, 1-9, 0-30:10, comma-separated; see
# gpusched.core.arrays) holds a task id, for the listings of ``12_3``.
_TASK_IN = """
CREATE FUNCTION gpusched_task_in(tasks text, task integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT coalesce(bool_or(task BETWEEN r.first AND r.last AND (task - r.first) % r.step = 0),
                  false)
  FROM (SELECT split_part(part, '-', 1)::integer AS first,
               coalesce(nullif(split_part(split_part(part, ':', 1), '-', 2), ''),
                        split_part(part, '-', 1))::integer AS last,
               coalesce(nullif(split_part(part, ':', 2), ''), '1')::integer AS step
        FROM unnest(string_to_array(tasks, ',')) AS part) AS r
$$
"""


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("jobs", sa.Column("suspended_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("jobs", sa.Column("suspended_seconds", sa.Float(), nullable=False,
                                    server_default=sa.text("0")))
    op.add_column("jobs", sa.Column("top_rank", sa.BigInteger(), nullable=True))
    op.create_check_constraint(op.f("ck_jobs_suspended_seconds"), "jobs",
                               "suspended_seconds >= 0")
    op.drop_constraint("kind", "node_commands", type_="check")
    op.create_check_constraint("kind", "node_commands", f"kind IN ({_OLD_KINDS}, 'suspend')")
    op.execute(_TASK_IN)


def downgrade() -> None:
    """Revert this revision (suspend commands are dropped)."""
    op.execute("DROP FUNCTION gpusched_task_in(text, integer)")
    op.execute("DELETE FROM node_commands WHERE kind = 'suspend'")
    op.drop_constraint("kind", "node_commands", type_="check")
    op.create_check_constraint("kind", "node_commands", f"kind IN ({_OLD_KINDS})")
    op.drop_constraint(op.f("ck_jobs_suspended_seconds"), "jobs", type_="check")
    for column in ("top_rank", "suspended_seconds", "suspended_at"):
        op.drop_column("jobs", column)
