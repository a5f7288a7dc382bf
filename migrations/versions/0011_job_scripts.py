"""What a job runs (its script, arguments and environment) moves out of the jobs table
into job_scripts; a job names its own with script_id, and the tasks of an array share
their record's instead of each carrying a copy.

The scheduling pass and the queue listing read every pending job's row, and each pass
updates many of them; without the script and environment (often one to several kB)
those rows are a few hundred bytes. Existing jobs keep their own scripts, numbered as
the jobs are.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PAYLOAD = ("script", "args", "environment")


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "job_scripts",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("script", sa.Text(), nullable=False),
        sa.Column("args", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"),
                  nullable=False),
        sa.Column("environment", postgresql.JSONB(astext_type=sa.Text()),
                  server_default=sa.text("'{}'"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_scripts")),
    )
    op.execute("INSERT INTO job_scripts (id, script, args, environment) "
               "SELECT id, script, args, environment FROM jobs")
    op.execute("SELECT setval(pg_get_serial_sequence('job_scripts', 'id'), "
               "coalesce((SELECT max(id) FROM job_scripts), 0) + 1, false)")
    op.add_column("jobs", sa.Column("script_id", sa.BigInteger(), nullable=True))
    op.execute("UPDATE jobs SET script_id = id")
    op.alter_column("jobs", "script_id", nullable=False)
    op.create_foreign_key(op.f("fk_jobs_script_id_job_scripts"), "jobs", "job_scripts",
                          ["script_id"], ["id"])
    for column in _PAYLOAD:
        op.drop_column("jobs", column)


def downgrade() -> None:
    """Revert this revision."""
    op.add_column("jobs", sa.Column("script", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("args", postgresql.ARRAY(sa.Text()),
                                    server_default=sa.text("'{}'"), nullable=False))
    op.add_column("jobs", sa.Column("environment", postgresql.JSONB(astext_type=sa.Text()),
                                    server_default=sa.text("'{}'"), nullable=False))
    op.execute("UPDATE jobs SET script = s.script, args = s.args, environment = s.environment "
               "FROM job_scripts AS s WHERE s.id = jobs.script_id")
    op.alter_column("jobs", "script", nullable=False)
    op.drop_constraint(op.f("fk_jobs_script_id_job_scripts"), "jobs", type_="foreignkey")
    op.drop_column("jobs", "script_id")
    op.drop_table("job_scripts")
