"""Jobs may depend on other jobs (sbatch's --dependency text).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22 08:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("jobs", sa.Column("dependency", sa.Text(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    op.drop_column("jobs", "dependency")
