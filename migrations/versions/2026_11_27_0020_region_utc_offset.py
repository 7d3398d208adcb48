"""regions: their local time's offset from UTC, so that batches' lines go first to regions
where it is night

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27 11:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('regions', sa.Column('utc_offset_h', sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column('regions', 'utc_offset_h')
