"""rollouts: the rollout policy, the intent at each revision, holdings and rollouts; a
tenant may be disabled

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 16:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

JSONB = postgresql.JSONB(astext_type=sa.Text())


def upgrade() -> None:
    op.create_table('rollout_policies',
    sa.Column('strategy', sa.String(length=16), nullable=False),
    sa.Column('canary', sa.String(length=16), nullable=False),
    sa.Column('canary_region', sa.String(length=63), nullable=True),
    sa.Column('waves', JSONB, nullable=False),
    sa.Column('bake_s', sa.Float(), nullable=False),
    sa.Column('checks', JSONB, nullable=False),
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_rollout_policies')),
    sa.UniqueConstraint('name', name=op.f('uq_rollout_policies_name'))
    )
    op.create_table('intents',
    sa.Column('revision', sa.BigInteger(), autoincrement=False, nullable=False),
    sa.Column('doc', JSONB, nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('revision', name=op.f('pk_intents'))
    )
    op.create_table('holdings',
    sa.Column('target', sa.String(length=80), nullable=False),
    sa.Column('revision', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('target', name=op.f('pk_holdings'))
    )
    op.create_table('rollouts',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('revision', sa.BigInteger(), nullable=False),
    sa.Column('base', sa.BigInteger(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('actor', sa.String(length=63), nullable=False),
    sa.Column('policy', JSONB, nullable=False),
    sa.Column('waves', JSONB, nullable=False),
    sa.Column('wave', sa.Integer(), nullable=False),
    sa.Column('wave_started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('pushed_revision', sa.BigInteger(), nullable=True),
    sa.Column('before', JSONB, nullable=False),
    sa.Column('at_wave', JSONB, nullable=False),
    sa.Column('checks', JSONB, nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_rollouts'))
    )
    op.create_index(op.f('ix_rollouts_revision'), 'rollouts', ['revision'], unique=False)
    op.create_index(op.f('ix_rollouts_state'), 'rollouts', ['state'], unique=False)
    op.add_column(
        'tenants',
        sa.Column('disabled', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    )


def downgrade() -> None:
    op.drop_column('tenants', 'disabled')
    op.drop_index(op.f('ix_rollouts_state'), table_name='rollouts')
    op.drop_index(op.f('ix_rollouts_revision'), table_name='rollouts')
    op.drop_table('rollouts')
    op.drop_table('holdings')
    op.drop_table('intents')
    op.drop_table('rollout_policies')
