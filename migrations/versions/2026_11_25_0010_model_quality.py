"""model quality: the quality guard's figures for a model in every region, rolled up by the
leader

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 11:30:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

JSONB = postgresql.JSONB(astext_type=sa.Text())


def upgrade() -> None:
    op.create_table('model_quality',
    sa.Column('model_id', sa.BigInteger(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('data', JSONB, nullable=False),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_model_quality_model_id_models'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('model_id', name=op.f('pk_model_quality'))
    )


def downgrade() -> None:
    op.drop_table('model_quality')
