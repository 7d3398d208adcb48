"""rotation with an overlap: an API key's and a principal's previous secret, accepted until a
time; a principal's expiry; a bootstrap token's revocation; a tenant admin's tenant

Revision ID: 0029
Revises: 0028
Create Date: 2026-11-29 06:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0029'
down_revision = '0028'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('api_keys', sa.Column('previous_key_hash', sa.String(length=64), nullable=True))
    op.add_column('api_keys', sa.Column('previous_expires_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('bootstrap_tokens', sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('principals', sa.Column('tenant_id', sa.BigInteger(), nullable=True))
    op.create_index(op.f('ix_principals_tenant_id'), 'principals', ['tenant_id'], unique=False)
    op.create_foreign_key(op.f('fk_principals_tenant_id_tenants'), 'principals', 'tenants',
                          ['tenant_id'], ['id'])
    op.add_column('principals', sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('principals', sa.Column('previous_token_hash', sa.String(length=64), nullable=True))
    op.add_column('principals', sa.Column('previous_expires_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column('principals', 'previous_expires_at')
    op.drop_column('principals', 'previous_token_hash')
    op.drop_column('principals', 'expires_at')
    op.drop_constraint(op.f('fk_principals_tenant_id_tenants'), 'principals', type_='foreignkey')
    op.drop_index(op.f('ix_principals_tenant_id'), table_name='principals')
    op.drop_column('principals', 'tenant_id')
    op.drop_column('bootstrap_tokens', 'revoked_at')
    op.drop_column('api_keys', 'previous_expires_at')
    op.drop_column('api_keys', 'previous_key_hash')
