"""tiered routes: virtual models answered by one of their tiers; tenants opt in to them

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 17:30:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

JSONB = postgresql.JSONB(astext_type=sa.Text())


def upgrade() -> None:
    op.create_table('tiered_routes',
    sa.Column('tiers', JSONB, nullable=False),
    sa.Column('classifier', JSONB, nullable=True),
    sa.Column('external_classifier', JSONB, nullable=True),
    sa.Column('cascade', JSONB, nullable=True),
    sa.Column('capacity_moves', sa.Boolean(), nullable=False),
    sa.Column('conversation_ttl_s', sa.Integer(), nullable=False),
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tiered_routes')),
    sa.UniqueConstraint('name', name=op.f('uq_tiered_routes_name'))
    )
    op.add_column('tenants', sa.Column('tiering', sa.Boolean(), server_default='false', nullable=False))
    op.add_column('tenants', sa.Column('tier_floor', sa.String(length=63), nullable=True))


def downgrade() -> None:
    op.drop_column('tenants', 'tier_floor')
    op.drop_column('tenants', 'tiering')
    op.drop_table('tiered_routes')
