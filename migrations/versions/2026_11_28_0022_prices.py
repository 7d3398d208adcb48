"""prices: a model's prices (each from its time on), a tenant's discount

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


def downgrade() -> None:
    op.drop_column('usage_records', 'cost_nanos')
    op.drop_column('tenants', 'price_discount_percent')
    op.drop_column('models', 'pricing')
