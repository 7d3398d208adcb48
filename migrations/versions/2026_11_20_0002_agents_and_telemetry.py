"""agents and telemetry

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-20 23:59:46.732239
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('region_load',
    sa.Column('region_id', sa.BigInteger(), nullable=False),
    sa.Column('health', sa.String(length=16), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('data', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.ForeignKeyConstraint(['region_id'], ['regions.id'], name=op.f('fk_region_load_region_id_regions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('region_id', name=op.f('pk_region_load'))
    )
    op.create_table('agents',
    sa.Column('node_id', sa.BigInteger(), nullable=False),
    sa.Column('credential_hash', sa.String(length=64), nullable=False),
    sa.Column('agent_version', sa.String(length=64), nullable=False),
    sa.Column('registered_with', sa.String(length=63), nullable=True),
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], name=op.f('fk_agents_node_id_nodes'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_agents')),
    sa.UniqueConstraint('credential_hash', name=op.f('uq_agents_credential_hash')),
    sa.UniqueConstraint('name', name=op.f('uq_agents_name'))
    )
    op.create_index(op.f('ix_agents_node_id'), 'agents', ['node_id'], unique=True)
    op.create_table('node_telemetry',
    sa.Column('node_id', sa.BigInteger(), nullable=False),
    sa.Column('observed_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('data', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], name=op.f('fk_node_telemetry_node_id_nodes'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('node_id', name=op.f('pk_node_telemetry'))
    )
    op.create_table('telemetry_samples',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('node_id', sa.BigInteger(), nullable=False),
    sa.Column('observed_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('data', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], name=op.f('fk_telemetry_samples_node_id_nodes'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_telemetry_samples'))
    )
    op.create_index('ix_telemetry_samples_node_at', 'telemetry_samples', ['node_id', 'observed_at'], unique=False)
    op.add_column('nodes', sa.Column('health', sa.String(length=16), server_default='unknown', nullable=False))
    op.add_column('nodes', sa.Column('health_changed_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column('nodes', 'health_changed_at')
    op.drop_column('nodes', 'health')
    op.drop_index('ix_telemetry_samples_node_at', table_name='telemetry_samples')
    op.drop_table('telemetry_samples')
    op.drop_table('node_telemetry')
    op.drop_index(op.f('ix_agents_node_id'), table_name='agents')
    op.drop_table('agents')
    op.drop_table('region_load')
