"""Every write to the admin-configured tables a scheduling pass reads (partitions,
accounts, account_users, qos) sends ``NOTIFY gpusched, 'admin'`` from a statement
trigger, inside the writing transaction: controllers keep those tables between passes
(db/admincache.py) and hear of a change once it is committed, whatever wrote it.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The channel and payload of db/notify.py's CHANNEL and db/admincache.py's ADMIN_CHANGED.
_TABLES = ("partitions", "accounts", "account_users", "qos")


def upgrade() -> None:
    """Apply this revision."""
    op.execute("CREATE FUNCTION gpusched_admin_changed() RETURNS trigger LANGUAGE plpgsql AS "
               "$$ BEGIN PERFORM pg_notify('gpusched', 'admin'); RETURN NULL; END $$")
    for table in _TABLES:
        op.execute(f"CREATE TRIGGER admin_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE "
                   f"ON {table} FOR EACH STATEMENT EXECUTE FUNCTION gpusched_admin_changed()")


def downgrade() -> None:
    """Revert this revision."""
    for table in _TABLES:
        op.execute(f"DROP TRIGGER admin_changed ON {table}")
    op.execute("DROP FUNCTION gpusched_admin_changed()")
