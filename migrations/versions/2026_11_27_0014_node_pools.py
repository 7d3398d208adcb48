"""node pools: nodes alike in one cloud's region, with their GPU's price an hour, whether
they are spot, and their size limits; a node may belong to one

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27 01:30:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('node_pools',
    sa.Column('cloud_id', sa.BigInteger(), nullable=False),
    sa.Column('region_id', sa.BigInteger(), nullable=False),
    sa.Column('gpu_model', sa.String(length=64), nullable=False),
    sa.Column('gpus_per_node', sa.Integer(), nullable=False),
    sa.Column('price_per_gpu_hour', sa.Float(), nullable=False),
    sa.Column('spot', sa.Boolean(), nullable=False),
    sa.Column('min_nodes', sa.Integer(), nullable=False),
    sa.Column('max_nodes', sa.Integer(), nullable=False),
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['cloud_id'], ['clouds.id'], name=op.f('fk_node_pools_cloud_id_clouds')),
    sa.ForeignKeyConstraint(['region_id'], ['regions.id'], name=op.f('fk_node_pools_region_id_regions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_node_pools')),
    sa.UniqueConstraint('name', name=op.f('uq_node_pools_name'))
    )
    op.create_index(op.f('ix_node_pools_cloud_id'), 'node_pools', ['cloud_id'], unique=False)
    op.create_index(op.f('ix_node_pools_region_id'), 'node_pools', ['region_id'], unique=False)
    op.add_column('nodes', sa.Column('pool_id', sa.BigInteger(), nullable=True))
    op.create_index(op.f('ix_nodes_pool_id'), 'nodes', ['pool_id'], unique=False)
    op.create_foreign_key(op.f('fk_nodes_pool_id_node_pools'), 'nodes', 'node_pools',
                          ['pool_id'], ['id'])


def downgrade() -> None:
    op.drop_constraint(op.f('fk_nodes_pool_id_node_pools'), 'nodes', type_='foreignkey')
    op.drop_index(op.f('ix_nodes_pool_id'), table_name='nodes')
    op.drop_column('nodes', 'pool_id')
    op.drop_index(op.f('ix_node_pools_region_id'), table_name='node_pools')
    op.drop_index(op.f('ix_node_pools_cloud_id'), table_name='node_pools')
    op.drop_table('node_pools')
