"""Containers (pyxis's --container-* options): what a job asks for, and what each node
can run them with.

``jobs.container`` holds a job's container request as its submission gave it
(gpusched.messages.containers: the image, mounts, working directory, variable names and
switches; NULL: no container). ``nodes.container_runtime`` is the runtime the node's
agent registered (podman, enroot or apptainer; NULL: none), which the submission of a
container job checks against the nodes of its partition.

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-28 07:00:00
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0028"
# 0027 (node features) comes before this one; in a tree that does not have it yet, the
# newest revision there is.
down_revision: str | None = max(name[:4] for name in os.listdir(os.path.dirname(__file__))
                                if name[:4].isdigit() and name[:4] < "0028")
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.add_column("jobs", sa.Column("container", postgresql.JSONB(), nullable=True))
    op.create_check_constraint(op.f("ck_jobs_container"), "jobs",
                               "octet_length(container::text) <= 1048576")
    op.add_column("nodes", sa.Column("container_runtime", sa.Text(), nullable=True))
    op.create_check_constraint(op.f("ck_nodes_container_runtime"), "nodes",
                               "container_runtime IN ('podman', 'enroot', 'apptainer')")


def downgrade() -> None:
    """Revert this revision."""
    op.drop_constraint(op.f("ck_nodes_container_runtime"), "nodes", type_="check")
    op.drop_column("nodes", "container_runtime")
    op.drop_constraint(op.f("ck_jobs_container"), "jobs", type_="check")
    op.drop_column("jobs", "container")
