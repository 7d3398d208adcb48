"""adapters: tenants' LoRA adapters of the fleet's models (issue 45)

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-28 18:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0026'
down_revision = '0025'
branch_labels = None
depends_on = None

JSONB = postgresql.JSONB(astext_type=sa.Text())


def upgrade() -> None:
    op.create_table('adapters',
    sa.Column('base_model_id', sa.BigInteger(), nullable=False),
    sa.Column('source', sa.Text(), nullable=False),
    sa.Column('digest', sa.String(length=71), nullable=True),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('tenants', JSONB, nullable=False),
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['base_model_id'], ['models.id'], name=op.f('fk_adapters_base_model_id_models')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_adapters')),
    sa.UniqueConstraint('name', name=op.f('uq_adapters_name'))
    )
    op.create_index(op.f('ix_adapters_base_model_id'), 'adapters', ['base_model_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_adapters_base_model_id'), table_name='adapters')
    op.drop_table('adapters')
