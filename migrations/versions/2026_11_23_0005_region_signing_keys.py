"""regions.signing_key: the Ed25519 key a region signs the requests it escalates with

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 14:00:00
"""
from __future__ import annotations

import secrets

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('regions', sa.Column('signing_key', sa.LargeBinary(length=32), nullable=True))
    bind = op.get_bind()
    regions = sa.table('regions', sa.column('id', sa.Integer), sa.column('signing_key'))
    for (region_id,) in bind.execute(sa.select(regions.c.id)).all():
        bind.execute(
            regions.update()
            .where(regions.c.id == region_id)
            .values(signing_key=secrets.token_bytes(32))
        )
    op.alter_column('regions', 'signing_key', nullable=False)


def downgrade() -> None:
    op.drop_column('regions', 'signing_key')
