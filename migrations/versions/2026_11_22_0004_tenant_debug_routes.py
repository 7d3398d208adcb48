"""tenants.debug_routes: a tenant the snapshot lets see how its requests were routed

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 12:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        'tenants',
        sa.Column('debug_routes', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    )


def downgrade() -> None:
    op.drop_column('tenants', 'debug_routes')
