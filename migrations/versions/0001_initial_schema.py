"""Initial schema: partitions, nodes, GPUs and links, jobs, allocations.

Revision ID: 0001
Revises: 
Create Date: 2026-11-22 06:35:00.553538
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table('nodes',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('state', sa.Text(), server_default=sa.text("'DOWN'"), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('run_uid', sa.Integer(), nullable=True),
    sa.Column('registered_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_seen', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("state IN ('UP', 'DOWN', 'DRAIN')", name=op.f('ck_nodes_state')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_nodes')),
    sa.UniqueConstraint('name', name=op.f('uq_nodes_name'))
    )
    op.create_table('partitions',
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('nodes', postgresql.ARRAY(sa.Text()), server_default=sa.text("'{*}'"), nullable=False),
    sa.Column('is_default', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('max_time', sa.Integer(), nullable=True),
    sa.Column('default_time', sa.Integer(), nullable=True),
    sa.Column('state', sa.Text(), server_default=sa.text("'UP'"), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_partitions'))
    )
    op.create_table('gpus',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('node_id', sa.Integer(), nullable=False),
    sa.Column('parent_id', sa.Integer(), nullable=True),
    sa.Column('index', sa.Integer(), nullable=False),
    sa.Column('uuid', sa.Text(), nullable=False),
    sa.Column('name', sa.Text(), server_default=sa.text("''"), nullable=False),
    sa.Column('gpu_type', sa.Text(), nullable=True),
    sa.Column('mig_profile', sa.Text(), nullable=True),
    sa.Column('memory_mb', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('pci_bus_id', sa.Text(), server_default=sa.text("''"), nullable=False),
    sa.Column('healthy', sa.Boolean(), server_default=sa.text('true'), nullable=False),
    sa.Column('present', sa.Boolean(), server_default=sa.text('true'), nullable=False),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], name=op.f('fk_gpus_node_id_nodes'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['parent_id'], ['gpus.id'], name=op.f('fk_gpus_parent_id_gpus'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_gpus')),
    sa.UniqueConstraint('uuid', name=op.f('uq_gpus_uuid'))
    )
    op.create_index(op.f('ix_gpus_node_id_index'), 'gpus', ['node_id', 'index'], unique=False)
    op.create_table('jobs',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('uid', sa.Integer(), nullable=False),
    sa.Column('gid', sa.Integer(), nullable=False),
    sa.Column('user_name', sa.Text(), nullable=False),
    sa.Column('partition', sa.Text(), nullable=False),
    sa.Column('state', sa.Text(), server_default=sa.text("'PENDING'"), nullable=False),
    sa.Column('reason', sa.Text(), server_default=sa.text("'None'"), nullable=False),
    sa.Column('gpus', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('time_limit', sa.Integer(), nullable=True),
    sa.Column('submit_time', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('start_time', sa.DateTime(timezone=True), nullable=True),
    sa.Column('end_time', sa.DateTime(timezone=True), nullable=True),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('signal', sa.Integer(), nullable=True),
    sa.Column('error_message', sa.Text(), nullable=True),
    sa.Column('script', sa.Text(), nullable=False),
    sa.Column('args', postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"), nullable=False),
    sa.Column('work_dir', sa.Text(), nullable=False),
    sa.Column('environment', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'"), nullable=False),
    sa.Column('output', sa.Text(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('node_id', sa.Integer(), nullable=True),
    sa.Column('launched_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('cancel_requested_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("state IN ('PENDING', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT')", name=op.f('ck_jobs_state')),
    sa.CheckConstraint('gpus >= 0', name=op.f('ck_jobs_gpus')),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], name=op.f('fk_jobs_node_id_nodes')),
    sa.ForeignKeyConstraint(['partition'], ['partitions.name'], name=op.f('fk_jobs_partition_partitions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs'))
    )
    op.create_index('ix_jobs_active', 'jobs', ['state', 'submit_time'], unique=False, postgresql_where=sa.text("state IN ('PENDING', 'RUNNING')"))
    op.create_table('allocations',
    sa.Column('job_id', sa.BigInteger(), nullable=False),
    sa.Column('gpu_id', sa.Integer(), nullable=False),
    sa.Column('node_id', sa.Integer(), nullable=False),
    sa.Column('allocated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('released_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['gpu_id'], ['gpus.id'], name=op.f('fk_allocations_gpu_id_gpus')),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_allocations_job_id_jobs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], name=op.f('fk_allocations_node_id_nodes')),
    sa.PrimaryKeyConstraint('job_id', 'gpu_id', name=op.f('pk_allocations'))
    )
    op.create_index('uq_allocations_active_gpu', 'allocations', ['gpu_id'], unique=True, postgresql_where=sa.text('released_at IS NULL'))
    op.create_table('gpu_links',
    sa.Column('gpu_a', sa.Integer(), nullable=False),
    sa.Column('gpu_b', sa.Integer(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('nvlinks', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.CheckConstraint("kind IN ('NVLINK', 'PCIE_SWITCH', 'PCIE_HOST_BRIDGE', 'NUMA_NODE', 'SYSTEM')", name=op.f('ck_gpu_links_kind')),
    sa.CheckConstraint('gpu_a < gpu_b', name=op.f('ck_gpu_links_ordered')),
    sa.ForeignKeyConstraint(['gpu_a'], ['gpus.id'], name=op.f('fk_gpu_links_gpu_a_gpus'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['gpu_b'], ['gpus.id'], name=op.f('fk_gpu_links_gpu_b_gpus'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('gpu_a', 'gpu_b', name=op.f('pk_gpu_links'))
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table('gpu_links')
    op.drop_index('uq_allocations_active_gpu', table_name='allocations', postgresql_where=sa.text('released_at IS NULL'))
    op.drop_table('allocations')
    op.drop_index('ix_jobs_active', table_name='jobs', postgresql_where=sa.text("state IN ('PENDING', 'RUNNING')"))
    op.drop_table('jobs')
    op.drop_index(op.f('ix_gpus_node_id_index'), table_name='gpus')
    op.drop_table('gpus')
    op.drop_table('partitions')
    op.drop_table('nodes')
