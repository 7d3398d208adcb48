"""tenants.tokens_per_minute as a bigint: the API takes quotas up to 10^12 tokens a minute

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 17:30:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.alter_column('tenants', 'tokens_per_minute', type_=sa.BigInteger(),
                    existing_type=sa.Integer(), existing_nullable=True)


def downgrade() -> None:
    # quotas past the integer's range cannot go back: they become the largest it holds
    op.execute("UPDATE tenants SET tokens_per_minute = 2147483647 "
               "WHERE tokens_per_minute > 2147483647")
    op.alter_column('tenants', 'tokens_per_minute', type_=sa.Integer(),
                    existing_type=sa.BigInteger(), existing_nullable=True)
