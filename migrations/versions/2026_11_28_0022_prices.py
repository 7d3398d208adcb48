"""prices: a model's prices (each from its time on), a tenant's discount, each usage
record's cost; the ledger summed by hour for its reports

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-28 09:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('models', sa.Column('pricing', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.add_column('tenants', sa.Column('price_discount_percent', sa.Float(), server_default='0', nullable=False))
    op.add_column('usage_records', sa.Column('cost_nanos', sa.BigInteger(), nullable=True))
    op.add_column('usage_records', sa.Column('estimated', sa.Boolean(), server_default='false', nullable=False))
    op.create_table('usage_hours',
    sa.Column('hour', sa.DateTime(timezone=True), nullable=False),
    sa.Column('tenant', sa.String(length=63), nullable=False),
    sa.Column('api_key', sa.String(length=64), nullable=False),
    sa.Column('model', sa.String(length=255), nullable=False),
    sa.Column('region', sa.String(length=63), nullable=False),
    sa.Column('service_class', sa.String(length=16), nullable=False),
    sa.Column('requests', sa.BigInteger(), nullable=False),
    sa.Column('refused', sa.BigInteger(), nullable=False),
    sa.Column('unpriced', sa.BigInteger(), nullable=False),
    sa.Column('prompt_tokens', sa.BigInteger(), nullable=False),
    sa.Column('cached_tokens', sa.BigInteger(), nullable=False),
    sa.Column('completion_tokens', sa.BigInteger(), nullable=False),
    sa.Column('cost_nanos', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('hour', 'tenant', 'api_key', 'model', 'region', 'service_class',
                            name=op.f('pk_usage_hours'))
    )


def downgrade() -> None:
    op.drop_table('usage_hours')
    op.drop_column('usage_records', 'estimated')
    op.drop_column('usage_records', 'cost_nanos')
    op.drop_column('tenants', 'price_discount_percent')
    op.drop_column('models', 'pricing')
