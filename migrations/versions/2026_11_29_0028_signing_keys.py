"""signing_keys: regions' and the control plane's signing keys, sealed, several at a time

Seeds stored in clear (regions.signing_key, batch_signer) stay until the control plane seals
them at start (it alone reaches the KMS) and clears them.

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-29 06:00:00
"""
from __future__ import annotations

import secrets

import sqlalchemy as sa
from alembic import op

revision = '0028'
down_revision = '0027'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('signing_keys',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('region_id', sa.BigInteger(), nullable=True),
    sa.Column('kid', sa.String(length=16), nullable=False),
    sa.Column('public_key', sa.LargeBinary(length=32), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('kek_id', sa.Text(), nullable=False),
    sa.Column('wrapped_key', sa.LargeBinary(), nullable=False),
    sa.Column('nonce', sa.LargeBinary(length=12), nullable=False),
    sa.Column('ciphertext', sa.LargeBinary(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('state_revision', sa.BigInteger(), nullable=True),
    sa.Column('signs_from', sa.DateTime(timezone=True), nullable=True),
    sa.Column('retire_after', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['region_id'], ['regions.id'], name=op.f('fk_signing_keys_region_id_regions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_signing_keys')),
    sa.UniqueConstraint('kid', name=op.f('uq_signing_keys_kid'))
    )
    op.create_index(op.f('ix_signing_keys_region_id'), 'signing_keys', ['region_id'], unique=False)
    op.alter_column('regions', 'signing_key', existing_type=sa.LargeBinary(length=32),
                    nullable=True)


def downgrade() -> None:
    # a sealed key does not go back into the clear: what has none gets a new seed
    regions = sa.table('regions', sa.column('id', sa.BigInteger),
                       sa.column('signing_key', sa.LargeBinary))
    bind = op.get_bind()
    for (region_id,) in bind.execute(
            sa.select(regions.c.id).where(regions.c.signing_key.is_(None))).all():
        bind.execute(regions.update().where(regions.c.id == region_id)
                     .values(signing_key=secrets.token_bytes(32)))
    signer = sa.table('batch_signer', sa.column('id', sa.Integer), sa.column('seed', sa.LargeBinary))
    if bind.execute(sa.select(signer.c.id)).first() is None:
        bind.execute(signer.insert().values(id=1, seed=secrets.token_bytes(32)))
    op.alter_column('regions', 'signing_key', existing_type=sa.LargeBinary(length=32),
                    nullable=False)
    op.drop_index(op.f('ix_signing_keys_region_id'), table_name='signing_keys')
    op.drop_table('signing_keys')
