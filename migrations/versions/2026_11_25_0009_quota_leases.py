"""quota leases: each replica's agents' demand, and the leader's leases per tenant

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 09:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

JSONB = postgresql.JSONB(astext_type=sa.Text())


def upgrade() -> None:
    op.execute(sa.schema.CreateSequence(sa.Sequence('quota_lease_version')))
    op.create_table('quota_demand',
    sa.Column('replica', sa.String(length=64), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('data', JSONB, nullable=False),
    sa.PrimaryKeyConstraint('replica', name=op.f('pk_quota_demand'))
    )
    op.create_table('quota_leases',
    sa.Column('tenant', sa.String(length=63), nullable=False),
    sa.Column('version', sa.BigInteger(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('data', JSONB, nullable=False),
    sa.PrimaryKeyConstraint('tenant', name=op.f('pk_quota_leases'))
    )
    op.create_index(op.f('ix_quota_leases_version'), 'quota_leases', ['version'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_quota_leases_version'), table_name='quota_leases')
    op.drop_table('quota_leases')
    op.drop_table('quota_demand')
    op.execute(sa.schema.DropSequence(sa.Sequence('quota_lease_version')))
