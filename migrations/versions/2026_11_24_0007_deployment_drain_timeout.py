"""deployments.drain_timeout_s: how long a stopped or replaced engine may finish its requests

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 12:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        'deployments',
        sa.Column('drain_timeout_s', sa.Float(), server_default=sa.text('120'), nullable=False),
    )


def downgrade() -> None:
    op.drop_column('deployments', 'drain_timeout_s')
