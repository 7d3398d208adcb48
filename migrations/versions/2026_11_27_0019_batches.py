"""tenants' files and batches (the OpenAI Files and Batches API): files' records (their bytes
are the object store's), batches, each batch's lines with their state and answers, and the
control plane's key that signs the lines it sends

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27 10:00:00
"""
from __future__ import annotations

import os

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('files',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('tenant_id', sa.BigInteger(), nullable=False),
    sa.Column('filename', sa.String(length=255), nullable=False),
    sa.Column('purpose', sa.String(length=32), nullable=False),
    sa.Column('bytes', sa.BigInteger(), nullable=False),
    sa.Column('object_key', sa.String(length=255), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_files_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_files'))
    )
    op.create_index(op.f('ix_files_tenant_id'), 'files', ['tenant_id'], unique=False)
    op.create_table('batches',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('tenant_id', sa.BigInteger(), nullable=False),
    sa.Column('endpoint', sa.String(length=64), nullable=False),
    sa.Column('input_file_id', sa.String(length=40), nullable=False),
    sa.Column('completion_window', sa.String(length=8), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('total', sa.Integer(), nullable=False),
    sa.Column('completed', sa.Integer(), nullable=False),
    sa.Column('failed', sa.Integer(), nullable=False),
    sa.Column('output_file_id', sa.String(length=40), nullable=True),
    sa.Column('error_file_id', sa.String(length=40), nullable=True),
    sa.Column('errors', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('meta', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('in_progress_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finalizing_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('failed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('expired_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('cancelling_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('cancelled_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_batches_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_batches'))
    )
    op.create_index(op.f('ix_batches_status'), 'batches', ['status'], unique=False)
    op.create_index(op.f('ix_batches_tenant_id'), 'batches', ['tenant_id'], unique=False)
    op.create_table('batch_lines',
    sa.Column('batch_id', sa.String(length=40), nullable=False),
    sa.Column('line', sa.Integer(), nullable=False),
    sa.Column('custom_id', sa.String(length=512), nullable=False),
    sa.Column('model', sa.String(length=255), nullable=False),
    sa.Column('body', sa.LargeBinary(), nullable=False),
    sa.Column('state', sa.String(length=8), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('failures', sa.Integer(), nullable=False),
    sa.Column('region', sa.String(length=63), nullable=True),
    sa.Column('lease_until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('status_code', sa.Integer(), nullable=True),
    sa.Column('request_id', sa.String(length=128), nullable=True),
    sa.Column('answer', sa.LargeBinary(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('answered_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['batch_id'], ['batches.id'], name=op.f('fk_batch_lines_batch_id_batches'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('batch_id', 'line', name=op.f('pk_batch_lines'))
    )
    op.create_index('ix_batch_lines_open', 'batch_lines', ['batch_id', 'line'], unique=False,
                    postgresql_where=sa.text("state IN ('pending', 'running')"))
    signer = op.create_table('batch_signer',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('seed', sa.LargeBinary(), nullable=False),
    sa.CheckConstraint('id = 1', name=op.f('ck_batch_signer_singleton')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_batch_signer'))
    )
    op.bulk_insert(signer, [{'id': 1, 'seed': os.urandom(32)}])


def downgrade() -> None:
    op.drop_table('batch_signer')
    op.drop_index('ix_batch_lines_open', table_name='batch_lines',
                  postgresql_where=sa.text("state IN ('pending', 'running')"))
    op.drop_table('batch_lines')
    op.drop_index(op.f('ix_batches_tenant_id'), table_name='batches')
    op.drop_index(op.f('ix_batches_status'), table_name='batches')
    op.drop_table('batches')
    op.drop_index(op.f('ix_files_tenant_id'), table_name='files')
    op.drop_table('files')
