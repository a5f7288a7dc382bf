"""Keep the jobs table's rows small: once a row is long enough for PostgreSQL to
compress it (over about 2 kB, as a job with a login shell's environment is), its
environment and script are moved out of line (TOAST) until the row is under 128 bytes,
instead of stopping at 2 kB, which leaves a compressed environment in the row.

The scheduling pass and the queue listing scan every pending job and update its reason
each pass; with the environment inline those scans and updates touch ten times more
pages. Rows of under 2 kB are stored as before. Rows written before this revision keep
their layout until they are next written (``VACUUM FULL jobs`` rewrites them all).

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
