"""deployments: the capacity planner's bounds (`autoscale`); a deployment without them keeps
its fixed replicas

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 01:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        'deployments',
        sa.Column('autoscale', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )


def downgrade() -> None:
    op.drop_column('deployments', 'autoscale')
