"""Licenses (sbatch's -L): the cluster's counts and what each job asks for.

``licenses`` holds each license the admin configuration declares and its cluster-wide
count (it sends the ``admin`` NOTIFY on every write, as the other admin tables do since
0017); ``jobs.licenses`` holds a job's request in its canonical text
(``ansys:2,matlab:1``, gpusched.core.licenses; NULL: none).

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-28 05:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("jobs", sa.Column("licenses", sa.Text(), nullable=True))
    op.create_check_constraint(op.f("ck_jobs_licenses"), "jobs",
                               "char_length(licenses) <= 4096")
    op.create_table(
        "licenses",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.CheckConstraint("count >= 0", name=op.f("ck_licenses_count")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_licenses")),
    )
    op.execute("CREATE TRIGGER admin_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE "
               "ON licenses FOR EACH STATEMENT EXECUTE FUNCTION gpusched_admin_changed()")


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("licenses")
    op.drop_constraint(op.f("ck_jobs_licenses"), "jobs", type_="check")
    op.drop_column("jobs", "licenses")
