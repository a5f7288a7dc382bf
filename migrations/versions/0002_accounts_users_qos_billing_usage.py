"""Accounts, users, QOS, GPU billing, fair-share usage; partition tiers and account lists.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 07:43:52.315516
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table('accounts',
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('parent', sa.Text(), nullable=True),
    sa.Column('shares', sa.Integer(), server_default=sa.text('1'), nullable=False),
    sa.CheckConstraint('shares >= 0', name=op.f('ck_accounts_shares')),
    sa.ForeignKeyConstraint(['parent'], ['accounts.name'], name=op.f('fk_accounts_parent_accounts'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_accounts'))
    )
    op.create_table('fairshare_usage',
    sa.Column('user_name', sa.Text(), nullable=False),
    sa.Column('account', sa.Text(), nullable=False),
    sa.Column('usage', sa.Float(), server_default=sa.text('0'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('user_name', 'account', name=op.f('pk_fairshare_usage'))
    )
    op.create_table('gpu_billing',
    sa.Column('gpu_type', sa.Text(), nullable=False),
    sa.Column('weight', sa.Float(), nullable=False),
    sa.CheckConstraint('weight > 0', name=op.f('ck_gpu_billing_weight')),
    sa.PrimaryKeyConstraint('gpu_type', name=op.f('pk_gpu_billing'))
    )
    op.create_table('qos',
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('priority', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('max_gpus_per_user', sa.Integer(), nullable=True),
    sa.Column('max_jobs_per_user', sa.Integer(), nullable=True),
    sa.Column('grp_gpus', sa.Integer(), nullable=True),
    sa.Column('max_wall', sa.Integer(), nullable=True),
    sa.Column('preempt', postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_qos'))
    )
    op.create_table('account_users',
    sa.Column('user_name', sa.Text(), nullable=False),
    sa.Column('account', sa.Text(), nullable=False),
    sa.Column('shares', sa.Integer(), server_default=sa.text('1'), nullable=False),
    sa.Column('is_default', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.CheckConstraint('shares >= 0', name=op.f('ck_account_users_shares')),
    sa.ForeignKeyConstraint(['account'], ['accounts.name'], name=op.f('fk_account_users_account_accounts'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('user_name', 'account', name=op.f('pk_account_users'))
    )
    op.add_column('partitions', sa.Column('priority_tier', sa.Integer(), server_default=sa.text('0'), nullable=False))
    op.add_column('partitions', sa.Column('allow_accounts', postgresql.ARRAY(sa.Text()), nullable=True))
    op.add_column('partitions', sa.Column('deny_accounts', postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'"), nullable=False))
    op.add_column('partitions', sa.Column('max_gpus_per_job', sa.Integer(), nullable=True))
    op.create_check_constraint(op.f('ck_partitions_state'), 'partitions',
                               "state IN ('UP', 'DOWN', 'DRAIN', 'INACTIVE')")


def downgrade() -> None:
    """Revert this revision."""
    op.drop_constraint(op.f('ck_partitions_state'), 'partitions', type_='check')
    op.drop_column('partitions', 'max_gpus_per_job')
    op.drop_column('partitions', 'deny_accounts')
    op.drop_column('partitions', 'allow_accounts')
    op.drop_column('partitions', 'priority_tier')
    op.drop_table('account_users')
    op.drop_table('qos')
    op.drop_table('gpu_billing')
    op.drop_table('fairshare_usage')
    op.drop_table('accounts')
