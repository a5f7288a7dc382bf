"""Keep the jobs table's rows small: a job's environment and script, the bulk of each
row and read only when it is launched or shown, are stored out of line (TOAST) as soon
as a row passes 128 bytes, instead of only past 2 kB.

The scheduling pass and the queue listing scan every pending job and update its reason
each pass; with the environment inline (often 1 to 3 kB) those scans and updates touch
ten to thirty times more pages. Rows written before this revision keep their layout
until they are next written (``VACUUM FULL jobs`` rewrites them all at once).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.execute("ALTER TABLE jobs SET (toast_tuple_target = 128)")


def downgrade() -> None:
    """Revert this revision."""
    op.execute("ALTER TABLE jobs RESET (toast_tuple_target)")
