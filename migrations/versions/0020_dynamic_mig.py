"""Dynamic MIG: a partition may let the scheduler re-partition its nodes' idle MIG GPUs.

``partitions.dynamic_mig`` turns it on (default off) and ``partitions.mig_min_interval``
is the least number of seconds between two layout changes of one GPU (default 600).
``gpus.mig_changed_at`` is when a GPU's MIG layout last changed, as its agent's
registration showed. ``node_commands.kind`` gains ``mig``: a layout for the node's agent
to apply to one GPU (no job: ``job_id`` NULL).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-12 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_KINDS = "'launch', 'cancel', 'signal', 'limit', 'kill', 'step', 'step_cancel'"


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("partitions", sa.Column("dynamic_mig", sa.Boolean(),
                                          server_default=sa.text("false"), nullable=False))
    op.add_column("partitions", sa.Column("mig_min_interval", sa.Integer(),
                                          server_default=sa.text("600"), nullable=False))
    op.create_check_constraint("ck_partitions_mig_min_interval", "partitions",
                               "mig_min_interval BETWEEN 60 AND 604800")
    op.add_column("gpus", sa.Column("mig_changed_at", sa.DateTime(timezone=True), nullable=True))
    op.drop_constraint("kind", "node_commands", type_="check")
    op.create_check_constraint("kind", "node_commands", f"kind IN ({_OLD_KINDS}, 'mig')")
    op.create_index("ix_node_commands_mig", "node_commands", ["created_at"],
                    postgresql_where=sa.text("kind = 'mig'"))


def downgrade() -> None:
    """Revert this revision (MIG commands are dropped)."""
    op.drop_index("ix_node_commands_mig", table_name="node_commands")
    op.execute("DELETE FROM node_commands WHERE kind = 'mig'")
    op.drop_constraint("kind", "node_commands", type_="check")
    op.create_check_constraint("kind", "node_commands", f"kind IN ({_OLD_KINDS})")
    op.drop_column("gpus", "mig_changed_at")
    op.drop_constraint("ck_partitions_mig_min_interval", "partitions", type_="check")
    op.drop_column("partitions", "mig_min_interval")
    op.drop_column("partitions", "dynamic_mig")
