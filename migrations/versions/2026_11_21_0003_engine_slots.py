"""engine slots: where each engine was placed, so that placement is sticky

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21 02:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('engine_slots',
    sa.Column('engine_id', sa.String(length=160), nullable=False),
    sa.Column('deployment_id', sa.BigInteger(), nullable=False),
    sa.Column('node_id', sa.BigInteger(), nullable=False),
    sa.Column('gpu_indexes', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('port', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['deployment_id'], ['deployments.id'], name=op.f('fk_engine_slots_deployment_id_deployments'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['node_id'], ['nodes.id'], name=op.f('fk_engine_slots_node_id_nodes'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('engine_id', name=op.f('pk_engine_slots')),
    sa.UniqueConstraint('node_id', 'port', name=op.f('uq_engine_slots_node_id'))
    )
    op.create_index(op.f('ix_engine_slots_deployment_id'), 'engine_slots', ['deployment_id'], unique=False)
    op.create_index(op.f('ix_engine_slots_node_id'), 'engine_slots', ['node_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_engine_slots_node_id'), table_name='engine_slots')
    op.drop_index(op.f('ix_engine_slots_deployment_id'), table_name='engine_slots')
    op.drop_table('engine_slots')
