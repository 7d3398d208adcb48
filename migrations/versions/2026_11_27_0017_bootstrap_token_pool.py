"""bootstrap tokens: the node pool whose machines use one, which the nodes it creates join

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 05:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('bootstrap_tokens', sa.Column('pool_id', sa.BigInteger(), nullable=True))
    op.create_index(op.f('ix_bootstrap_tokens_pool_id'), 'bootstrap_tokens', ['pool_id'],
                    unique=False)
    op.create_foreign_key(op.f('fk_bootstrap_tokens_pool_id_node_pools'), 'bootstrap_tokens',
                          'node_pools', ['pool_id'], ['id'], ondelete='SET NULL')


def downgrade() -> None:
    op.drop_constraint(op.f('fk_bootstrap_tokens_pool_id_node_pools'), 'bootstrap_tokens',
                       type_='foreignkey')
    op.drop_index(op.f('ix_bootstrap_tokens_pool_id'), table_name='bootstrap_tokens')
    op.drop_column('bootstrap_tokens', 'pool_id')
