"""sbatch's scheduling flags of a job, and the DEADLINE state.

``jobs.nice`` (--nice: positive lowers its priority; NULL: 0), ``jobs.open_mode``
(--open-mode: ``append`` or ``truncate``; NULL: append), ``jobs.time_min`` (--time-min,
seconds: backfill may start the job with a time limit cut down to no less than it) and
``jobs.deadline`` (--deadline: the job never starts unless it can end by then, and a
pending job that no longer can ends in state ``DEADLINE``, which ``jobs.state`` now
takes). --priority sets the existing ``jobs.admin_priority``.

Revision ID: 0030
Revises: 0029
Create Date: 2026-11-28 07:30:00
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MAX_NICE = 2_147_483_645  # sbatch's bound


def _job_states() -> list[str]:
    """The states ``jobs.state`` takes now (an earlier revision may have added some)."""
    definition = op.get_bind().execute(sa.text(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = 'jobs'::regclass AND conname = 'ck_jobs_state'")).scalar_one()
    return re.findall(r"'([A-Z_]+)'", definition)


def _state_check(states: list[str]) -> None:
    op.drop_constraint("state", "jobs", type_="check")
    op.create_check_constraint("state", "jobs",
                               f"state IN ({', '.join(repr(s) for s in states)})")


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("jobs", sa.Column("nice", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("open_mode", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("time_min", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("deadline", sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint(op.f("ck_jobs_nice"), "jobs",
                               f"nice BETWEEN -{MAX_NICE} AND {MAX_NICE}")
    op.create_check_constraint(op.f("ck_jobs_open_mode"), "jobs",
                               "open_mode IN ('append', 'truncate')")
    op.create_check_constraint(op.f("ck_jobs_time_min"), "jobs", "time_min >= 0")
    _state_check([*_job_states(), "DEADLINE"])


def downgrade() -> None:
    """Revert this revision (jobs that ended DEADLINE become CANCELLED)."""
    op.execute("UPDATE jobs SET state = 'CANCELLED' WHERE state = 'DEADLINE'")
    _state_check([s for s in _job_states() if s != "DEADLINE"])
    for name in ("time_min", "open_mode", "nice"):
        op.drop_constraint(op.f(f"ck_jobs_{name}"), "jobs", type_="check")
    for name in ("deadline", "time_min", "open_mode", "nice"):
        op.drop_column("jobs", name)
