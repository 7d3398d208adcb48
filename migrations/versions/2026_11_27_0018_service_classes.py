"""service classes: tenants' default class and ceiling, routing policies' classes block, and
the classes each fallback rule escalates (rules of one scope may now split the classes)

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27 09:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('tenants', sa.Column('default_class', sa.String(length=16),
                                       server_default='standard', nullable=False))
    op.add_column('tenants', sa.Column('class_ceiling', sa.String(length=16),
                                       server_default='standard', nullable=False))
    op.add_column('routing_policies', sa.Column('classes',
                                                postgresql.JSONB(astext_type=sa.Text()),
                                                nullable=True))
    op.add_column('fallback_rules', sa.Column(
        'classes', postgresql.JSONB(astext_type=sa.Text()),
        server_default=sa.text('\'["interactive", "standard"]\'::jsonb'), nullable=False))
    op.drop_index('uq_fallback_rules_scope', table_name='fallback_rules')
    op.create_index('ix_fallback_rules_scope', 'fallback_rules',
                    ['region_id', sa.text('coalesce(model_id, 0)'),
                     sa.text("coalesce(tenant_tier, '')")], unique=False)


def downgrade() -> None:
    op.drop_index('ix_fallback_rules_scope', table_name='fallback_rules')
    op.create_index('uq_fallback_rules_scope', 'fallback_rules',
                    ['region_id', sa.text('coalesce(model_id, 0)'),
                     sa.text("coalesce(tenant_tier, '')")], unique=True)
    op.drop_column('fallback_rules', 'classes')
    op.drop_column('routing_policies', 'classes')
    op.drop_column('tenants', 'class_ceiling')
    op.drop_column('tenants', 'default_class')
