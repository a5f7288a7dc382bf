"""Mail about jobs: sbatch's --mail-type and --mail-user.

``jobs`` gains ``mail_types`` (the types asked for, ALL expanded; NULL: no mail),
``mail_user`` (whom to tell) and ``mail_done_at`` (when the mail job recorded the last
event it will send for the job), with a partial index over the jobs still watched.
``mail_events`` holds each mail, keyed by (job, run, event), recorded before it is sent:
queued, sending, sent or failed, with its attempts.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0023"
# 0022 (GPU-hour budgets) is numbered for work not yet here: whichever of the two comes
# second revises the other.
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As gpusched.core.mail.MAIL_TYPES and MAX_MAIL_USER, frozen at this revision.
_TYPES = ("'BEGIN', 'END', 'FAIL', 'REQUEUE', 'INVALID_DEPEND', 'STAGE_OUT', 'TIME_LIMIT', "
          "'TIME_LIMIT_90', 'TIME_LIMIT_80', 'TIME_LIMIT_50', 'ARRAY_TASKS'")


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("jobs", sa.Column("mail_types", postgresql.ARRAY(sa.Text()), nullable=True))
    op.add_column("jobs", sa.Column("mail_user", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("mail_done_at", sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint(op.f("ck_jobs_mail_types"), "jobs", f"mail_types <@ ARRAY[{_TYPES}]")
    op.create_check_constraint(op.f("ck_jobs_mail_user"), "jobs", "char_length(mail_user) <= 254")
    op.create_index("ix_jobs_mail_watch", "jobs", ["id"],
                    postgresql_where=sa.text("mail_types IS NOT NULL AND mail_done_at IS NULL"))
    op.create_table(
        "mail_events",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("run", sa.Integer(), nullable=False),
        sa.Column("event", sa.Text(), nullable=False),
        sa.Column("recipient", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), server_default=sa.text("'queued'"), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), server_default=sa.func.now(),
                  nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(),
                  nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint("state IN ('queued', 'sending', 'sent', 'failed')",
                           name=op.f("ck_mail_events_state")),
        sa.CheckConstraint("run >= 0", name=op.f("ck_mail_events_run")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_mail_events_job_id_jobs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "run", "event", name=op.f("pk_mail_events")),
    )
    op.create_index("ix_mail_events_due", "mail_events", ["next_attempt_at"],
                    postgresql_where=sa.text("state = 'queued'"))


def downgrade() -> None:
    """Revert this revision (every recorded mail is dropped)."""
    op.drop_index("ix_mail_events_due", table_name="mail_events")
    op.drop_table("mail_events")
    op.drop_index("ix_jobs_mail_watch", table_name="jobs")
    op.drop_constraint(op.f("ck_jobs_mail_user"), "jobs", type_="check")
    op.drop_constraint(op.f("ck_jobs_mail_types"), "jobs", type_="check")
    for column in ("mail_done_at", "mail_user", "mail_types"):
        op.drop_column("jobs", column)
