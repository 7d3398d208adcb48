"""adapter_plans: the engines of a region that keep a LoRA adapter loaded (issue 45)

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-28 21:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0027'
down_revision = '0026'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('adapter_plans',
    sa.Column('adapter_id', sa.BigInteger(), nullable=False),
    sa.Column('region_id', sa.BigInteger(), nullable=False),
    sa.Column('engines', sa.Integer(), nullable=False),
    sa.Column('changed_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['adapter_id'], ['adapters.id'], name=op.f('fk_adapter_plans_adapter_id_adapters'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['region_id'], ['regions.id'], name=op.f('fk_adapter_plans_region_id_regions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('adapter_id', 'region_id', name=op.f('pk_adapter_plans'))
    )
    op.create_index(op.f('ix_adapter_plans_region_id'), 'adapter_plans', ['region_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_adapter_plans_region_id'), table_name='adapter_plans')
    op.drop_table('adapter_plans')
