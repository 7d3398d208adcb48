"""node pools: the cloud's group of machines the capacity planner resizes

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27 04:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('node_pools', sa.Column('group', sa.String(length=255), nullable=True))


def downgrade() -> None:
    op.drop_column('node_pools', 'group')
