"""Advance reservations (``gcontrol create reservation``) and the jobs that run in them.

``advance_reservations`` holds each reservation: its window (``start_time`` to
``end_time``, repeated every day or week with the DAILY or WEEKLY flag), the nodes it
holds and on each the GPUs held (``node_gpus``, same order; 0: the whole node), who may
use it (``users``, ``accounts``: names, or all but the names when each starts with
``-``) and its flags. Every write sends the ``admin`` NOTIFY, as the other tables a pass
keeps between passes (0017). ``jobs.reservation`` names the reservation a job asked for
(``--reservation``); a partial index finds the live ones.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-28 06:45:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "advance_reservations",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("start_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("nodes", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("node_gpus", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("users", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"),
                  nullable=False),
        sa.Column("accounts", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"),
                  nullable=False),
        sa.Column("flags", postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"),
                  nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.CheckConstraint("char_length(name) BETWEEN 1 AND 64",
                           name=op.f("ck_advance_reservations_name")),
        sa.CheckConstraint("end_time > start_time", name=op.f("ck_advance_reservations_window")),
        sa.CheckConstraint("cardinality(nodes) BETWEEN 1 AND 4096 "
                           "AND cardinality(node_gpus) = cardinality(nodes)",
                           name=op.f("ck_advance_reservations_holds")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_advance_reservations")),
    )
    op.execute("CREATE TRIGGER admin_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE "
               "ON advance_reservations FOR EACH STATEMENT "
               "EXECUTE FUNCTION gpusched_admin_changed()")
    op.add_column("jobs", sa.Column("reservation", sa.Text(), nullable=True))
    op.create_check_constraint(op.f("ck_jobs_reservation"), "jobs",
                               "char_length(reservation) <= 64")
    op.create_index("ix_jobs_reservation", "jobs", ["reservation"],
                    postgresql_where=sa.text("reservation IS NOT NULL "
                                             "AND state IN ('PENDING', 'RUNNING')"))


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_jobs_reservation", table_name="jobs")
    op.drop_constraint(op.f("ck_jobs_reservation"), "jobs", type_="check")
    op.drop_column("jobs", "reservation")
    op.drop_table("advance_reservations")
