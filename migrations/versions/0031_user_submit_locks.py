"""Users' submissions locks: ``user_submit_locks`` holds a row per user that every
submission updates (holding it to its commit, as pg_advisory_xact_lock was held before)
and whose ``version`` tells a submission made in one statement whether another of the
same user's was stored since its snapshot.

Revision ID: 0031
Revises: 0030
Create Date: 2026-11-28 07:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "user_submit_locks",
        sa.Column("uid", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("uid", name=op.f("pk_user_submit_locks")),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("user_submit_locks")
