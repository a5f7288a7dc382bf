"""The version of what submissions check that rarely changes: ``submit_facts_version``
holds one row whose ``version`` every change of those facts raises (triggers on
partitions, accounts, account_users, qos, and on what submissions read of nodes and
gpus), so that a submission made in one statement (db/submit_store.py) learns whether
the facts it was checked against still hold by reading one row, whatever the size of
the cluster, instead of hashing them again.

Revision ID: 0032
Revises: 0031
Create Date: 2026-11-28 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0032"
down_revision: str | None = "0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Tables an administrator changes (configuration): any row written counts.
_ADMIN_TABLES = ("partitions", "accounts", "account_users", "qos")
# Of nodes and gpus, the columns submissions read (db/submit_facts.py _MEMBERS).
_READ_COLUMNS = {"nodes": ("name", "cpus", "memory_mb"),
                 "gpus": ("node_id", "gpu_type", "mig_profile", "memory_mb", "present",
                          "parent_id")}


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "submit_facts_version",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_submit_facts_version_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_submit_facts_version")),
    )
    op.execute("INSERT INTO submit_facts_version (id, version) VALUES (1, 1)")
    # Raised once per transaction, at its commit (the triggers are deferred): the row is
    # the last lock a transaction takes, held only while it commits, so no transaction
    # waits for another while holding it.
    op.execute(
        "CREATE FUNCTION bump_submit_facts() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN"
        " IF current_setting('gpusched.facts_bumped', true) = 'on' THEN RETURN NULL; END IF;"
        " PERFORM set_config('gpusched.facts_bumped', 'on', true);"
        " INSERT INTO submit_facts_version (id, version) VALUES (1, 1) ON CONFLICT (id)"
        " DO UPDATE SET version = submit_facts_version.version + 1;"
        " RETURN NULL;"
        " END $$")
    for table in (*_ADMIN_TABLES, *_READ_COLUMNS):
        columns = _READ_COLUMNS.get(table)
        changed = ""
        if columns is not None:
            old = ", ".join(f"OLD.{column}" for column in columns)
            new = ", ".join(f"NEW.{column}" for column in columns)
            changed = f" WHEN (({old}) IS DISTINCT FROM ({new}))"
            op.execute(f"CREATE CONSTRAINT TRIGGER submit_facts_added AFTER INSERT OR DELETE"
                       f" ON {table} DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
                       " EXECUTE FUNCTION bump_submit_facts()")
        op.execute(f"CREATE CONSTRAINT TRIGGER submit_facts_changed AFTER"
                   f" {'UPDATE' if columns else 'INSERT OR UPDATE OR DELETE'} ON {table}"
                   f" DEFERRABLE INITIALLY DEFERRED FOR EACH ROW{changed}"
                   " EXECUTE FUNCTION bump_submit_facts()")
        op.execute(f"CREATE TRIGGER submit_facts_truncated AFTER TRUNCATE ON {table}"
                   " FOR EACH STATEMENT EXECUTE FUNCTION bump_submit_facts()")


def downgrade() -> None:
    """Revert this revision."""
    for table in (*_ADMIN_TABLES, *_READ_COLUMNS):
        names = ["submit_facts_changed", "submit_facts_truncated"]
        if table in _READ_COLUMNS:
            names.append("submit_facts_added")
        for name in names:
            op.execute(f"DROP TRIGGER {name} ON {table}")
    op.execute("DROP FUNCTION bump_submit_facts()")
    op.drop_table("submit_facts_version")
