"""tenants: a limit of requests under way at once (leased like the quotas), and a weight in
fair admission

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 15:10:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # tenants made before the limit existed get the default, as new ones do
    op.add_column('tenants', sa.Column('max_concurrency', sa.Integer(), nullable=True))
    op.execute("UPDATE tenants SET max_concurrency = 256")
    op.add_column('tenants', sa.Column('weight', sa.Float(), server_default='1', nullable=False))


def downgrade() -> None:
    op.drop_column('tenants', 'weight')
    op.drop_column('tenants', 'max_concurrency')
