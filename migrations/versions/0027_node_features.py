"""Node features (sbatch's -C/--constraint).

``nodes.features`` holds the features a node's agent reports from its GPUs (GPU type
and model, memory, NVLink, compute capability: gpusched.core.features.gpu_features);
``node_features`` holds those the admin configuration gives nodes by name
(``[[node]] features``), kept apart since a node may be configured before its agent
first registers (it sends the ``admin`` NOTIFY on every write, as the other admin
tables do since 0017). ``jobs.constraints`` holds a job's -C in its canonical text
(gpusched.core.features; NULL: none), with a partial index of the pending ones, which
every pass reads.

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-28 06:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("nodes", sa.Column("features", ARRAY(sa.Text()), nullable=False,
                                     server_default=sa.text("'{}'")))
    op.create_table(
        "node_features",
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("features", ARRAY(sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("node", name=op.f("pk_node_features")),
    )
    op.execute("CREATE TRIGGER admin_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE "
               "ON node_features FOR EACH STATEMENT EXECUTE FUNCTION gpusched_admin_changed()")
    op.add_column("jobs", sa.Column("constraints", sa.Text(), nullable=True))
    op.create_check_constraint(op.f("ck_jobs_constraints"), "jobs",
                               "char_length(constraints) <= 1024")
    op.create_index("ix_jobs_constrained", "jobs", ["id"], postgresql_where=sa.text(
        "constraints IS NOT NULL AND state = 'PENDING'"))


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_jobs_constrained", table_name="jobs")
    op.drop_constraint(op.f("ck_jobs_constraints"), "jobs", type_="check")
    op.drop_column("jobs", "constraints")
    op.drop_table("node_features")
    op.drop_column("nodes", "features")
