"""usage_records.worker: the engine that served a request, and the `meter` records of the
engines' own counters, for reconciliation

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-28 12:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('usage_records', sa.Column('worker', sa.String(length=255), server_default='', nullable=False))


def downgrade() -> None:
    op.drop_column('usage_records', 'worker')
