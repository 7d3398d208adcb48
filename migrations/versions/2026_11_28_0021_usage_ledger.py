"""the usage ledger: a record per request, partitioned by month (the partitions live in
schema usage_parts, made as records arrive)

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28 08:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute('CREATE SCHEMA IF NOT EXISTS usage_parts')
    op.create_table('usage_records',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('request_id', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=8), nullable=False),
    sa.Column('tenant', sa.String(length=63), nullable=False),
    sa.Column('api_key', sa.String(length=64), nullable=False),
    sa.Column('model', sa.String(length=255), nullable=False),
    sa.Column('answered_model', sa.String(length=255), nullable=False),
    sa.Column('region', sa.String(length=63), nullable=False),
    sa.Column('node', sa.String(length=63), nullable=False),
    sa.Column('service_class', sa.String(length=16), nullable=False),
    sa.Column('prompt_tokens', sa.BigInteger(), nullable=False),
    sa.Column('cached_tokens', sa.BigInteger(), nullable=False),
    sa.Column('completion_tokens', sa.BigInteger(), nullable=False),
    sa.Column('outcome', sa.String(length=64), nullable=False),
    sa.Column('status', sa.Integer(), nullable=False),
    sa.Column('came_from', sa.String(length=63), nullable=False),
    sa.Column('escalated_to', sa.String(length=63), nullable=False),
    sa.Column('calls', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('stored_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', 'started_at', name=op.f('pk_usage_records')),
    postgresql_partition_by='RANGE (started_at)',
    )
    op.create_index('ix_usage_records_tenant_started', 'usage_records', ['tenant', 'started_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_usage_records_tenant_started', table_name='usage_records')
    op.drop_table('usage_records')
    op.execute('DROP SCHEMA IF EXISTS usage_parts CASCADE')
