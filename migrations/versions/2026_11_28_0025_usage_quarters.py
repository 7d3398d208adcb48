"""usage_quarters: the ledger's sums by quarter hour (UTC), in place of usage_hours, so that a
report in any time zone (every zone's offset is whole quarter hours: Asia/Kolkata, +5:30,
Asia/Kathmandu, +5:45) is read from the sums; filled from the records already stored; and an
index of the records by start

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-28 15:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0025'
down_revision = '0024'
branch_labels = None
depends_on = None

KEY = ('tenant', 'api_key', 'model', 'region', 'service_class')
SUMS = ('requests', 'refused', 'unpriced', 'prompt_tokens', 'cached_tokens', 'completion_tokens',
        'cost_nanos')


def _table(name: str, at: str) -> None:
    op.create_table(name,
    sa.Column(at, sa.DateTime(timezone=True), nullable=False),
    sa.Column('tenant', sa.String(length=63), nullable=False),
    sa.Column('api_key', sa.String(length=64), nullable=False),
    sa.Column('model', sa.String(length=255), nullable=False),
    sa.Column('region', sa.String(length=63), nullable=False),
    sa.Column('service_class', sa.String(length=16), nullable=False),
    sa.Column('requests', sa.BigInteger(), nullable=False),
    sa.Column('refused', sa.BigInteger(), nullable=False),
    sa.Column('unpriced', sa.BigInteger(), nullable=False),
    sa.Column('prompt_tokens', sa.BigInteger(), nullable=False),
    sa.Column('cached_tokens', sa.BigInteger(), nullable=False),
    sa.Column('completion_tokens', sa.BigInteger(), nullable=False),
    sa.Column('cost_nanos', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint(at, *KEY, name=op.f(f'pk_{name}'))
    )


def _fill(name: str, at: str, bucket: str) -> None:
    """The sums, from the records (served and refused, as the store adds them)."""
    op.execute(
        f"INSERT INTO {name} ({at}, {', '.join(KEY)}, {', '.join(SUMS)}) "
        f"SELECT {bucket}, {', '.join(KEY)}, count(*) FILTER (WHERE kind = 'served'), "
        "count(*) FILTER (WHERE kind = 'refused'), "
        "count(*) FILTER (WHERE kind = 'served' AND cost_nanos IS NULL), sum(prompt_tokens), "
        "sum(cached_tokens), sum(completion_tokens), coalesce(sum(cost_nanos), 0) "
        "FROM usage_records WHERE kind IN ('served', 'refused') "
        f"GROUP BY 1, {', '.join(str(n) for n in range(2, 2 + len(KEY)))}"
    )


def upgrade() -> None:
    _table('usage_quarters', 'at')
    _fill('usage_quarters', 'at',
          "date_bin('15 minutes', started_at, TIMESTAMPTZ '2000-01-01 00:00:00+00')")
    op.drop_table('usage_hours')
    # a report's ends (a period from any second) and an export read the records by time alone
    op.create_index('ix_usage_records_started', 'usage_records', ['started_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_usage_records_started', table_name='usage_records')
    _table('usage_hours', 'hour')
    _fill('usage_hours', 'hour', "date_trunc('hour', started_at, 'UTC')")
    op.drop_table('usage_quarters')
