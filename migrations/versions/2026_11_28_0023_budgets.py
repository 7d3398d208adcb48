"""budgets: a tenant's spend budgets (per day or month, its own or one API key's)

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28 11:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('tenants', sa.Column('budgets', postgresql.JSONB(astext_type=sa.Text()), server_default='[]', nullable=False))


def downgrade() -> None:
    op.drop_column('tenants', 'budgets')
