"""Jobs record the account they charge and their QOS.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 07:50:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("jobs", sa.Column("account", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("qos", sa.Text(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    op.drop_column("jobs", "qos")
    op.drop_column("jobs", "account")
