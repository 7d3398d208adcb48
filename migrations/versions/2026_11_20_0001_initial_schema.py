"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-20 23:30:13.849605
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('audit_events',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('revision', sa.BigInteger(), nullable=False),
    sa.Column('principal', sa.String(length=63), nullable=False),
    sa.Column('action', sa.String(length=16), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('before', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('after', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_events'))
    )
    op.create_index(op.f('ix_audit_events_revision'), 'audit_events', ['revision'], unique=False)
    op.create_table('clouds',
    sa.Column('provider', sa.String(length=32), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_clouds')),
    sa.UniqueConstraint('name', name=op.f('uq_clouds_name'))
    )
    op.create_table('config_revision',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('revision', sa.BigInteger(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('id = 1', name=op.f('ck_config_revision_singleton')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_config_revision'))
    )
    op.execute("INSERT INTO config_revision (id, revision) VALUES (1, 0)")
    op.create_table('models',
    sa.Column('source', sa.Text(), nullable=False),
    sa.Column('context_length', sa.Integer(), nullable=False),
    sa.Column('capabilities', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('min_gpu_memory_gb', sa.Integer(), nullable=False),
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_models')),
    sa.UniqueConstraint('name', name=op.f('uq_models_name'))
    )
    op.create_table('principals',
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_principals')),
    sa.UniqueConstraint('name', name=op.f('uq_principals_name')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_principals_token_hash'))
    )
    op.create_table('tenants',
    sa.Column('tier', sa.String(length=32), nullable=False),
    sa.Column('allowed_jurisdictions', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('requests_per_minute', sa.Integer(), nullable=True),
    sa.Column('tokens_per_minute', sa.Integer(), nullable=True),
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tenants')),
    sa.UniqueConstraint('name', name=op.f('uq_tenants_name'))
    )
    op.create_table('api_keys',
    sa.Column('tenant_id', sa.BigInteger(), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('key_hash', sa.String(length=64), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_api_keys_tenant_id_tenants')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_keys')),
    sa.UniqueConstraint('key_hash', name=op.f('uq_api_keys_key_hash')),
    sa.UniqueConstraint('name', name=op.f('uq_api_keys_name'))
    )
    op.create_index(op.f('ix_api_keys_tenant_id'), 'api_keys', ['tenant_id'], unique=False)
    op.create_table('regions',
    sa.Column('cloud_id', sa.BigInteger(), nullable=False),
    sa.Column('geography', sa.String(length=63), nullable=False),
    sa.Column('jurisdiction', sa.String(length=32), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('gateway_url', sa.Text(), nullable=True),
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['cloud_id'], ['clouds.id'], name=op.f('fk_regions_cloud_id_clouds')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_regions')),
    sa.UniqueConstraint('name', name=op.f('uq_regions_name'))
    )
    op.create_index(op.f('ix_regions_cloud_id'), 'regions', ['cloud_id'], unique=False)
    op.create_table('bootstrap_tokens',
    sa.Column('region_id', sa.BigInteger(), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['region_id'], ['regions.id'], name=op.f('fk_bootstrap_tokens_region_id_regions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_bootstrap_tokens')),
    sa.UniqueConstraint('name', name=op.f('uq_bootstrap_tokens_name')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_bootstrap_tokens_token_hash'))
    )
    op.create_index(op.f('ix_bootstrap_tokens_region_id'), 'bootstrap_tokens', ['region_id'], unique=False)
    op.create_table('deployments',
    sa.Column('model_id', sa.BigInteger(), nullable=False),
    sa.Column('region_id', sa.BigInteger(), nullable=False),
    sa.Column('backend', sa.String(length=16), nullable=False),
    sa.Column('replicas', sa.Integer(), nullable=False),
    sa.Column('tp_size', sa.Integer(), nullable=False),
    sa.Column('dp_size', sa.Integer(), nullable=False),
    sa.Column('pd_mode', sa.String(length=16), nullable=False),
    sa.Column('prefill_replicas', sa.Integer(), nullable=False),
    sa.Column('decode_replicas', sa.Integer(), nullable=False),
    sa.Column('engine_args', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('external_urls', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_deployments_model_id_models')),
    sa.ForeignKeyConstraint(['region_id'], ['regions.id'], name=op.f('fk_deployments_region_id_regions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_deployments')),
    sa.UniqueConstraint('model_id', 'region_id', name=op.f('uq_deployments_model_id')),
    sa.UniqueConstraint('name', name=op.f('uq_deployments_name'))
    )
    op.create_index(op.f('ix_deployments_model_id'), 'deployments', ['model_id'], unique=False)
    op.create_index(op.f('ix_deployments_region_id'), 'deployments', ['region_id'], unique=False)
    op.create_table('fallback_rules',
    sa.Column('region_id', sa.BigInteger(), nullable=False),
    sa.Column('model_id', sa.BigInteger(), nullable=True),
    sa.Column('tenant_tier', sa.String(length=32), nullable=True),
    sa.Column('triggers', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('thresholds', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_fallback_rules_model_id_models')),
    sa.ForeignKeyConstraint(['region_id'], ['regions.id'], name=op.f('fk_fallback_rules_region_id_regions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_fallback_rules')),
    sa.UniqueConstraint('name', name=op.f('uq_fallback_rules_name'))
    )
    op.create_index(op.f('ix_fallback_rules_model_id'), 'fallback_rules', ['model_id'], unique=False)
    op.create_index(op.f('ix_fallback_rules_region_id'), 'fallback_rules', ['region_id'], unique=False)
    op.create_index('uq_fallback_rules_scope', 'fallback_rules', ['region_id', sa.text("coalesce(model_id, 0)"), sa.text("coalesce(tenant_tier, '')")], unique=True)
    op.create_table('nodes',
    sa.Column('region_id', sa.BigInteger(), nullable=False),
    sa.Column('hostname', sa.String(length=253), nullable=False),
    sa.Column('gpus', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('last_heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('desired_revision', sa.BigInteger(), nullable=True),
    sa.Column('applied_revision', sa.BigInteger(), nullable=True),
    sa.Column('last_nack_reason', sa.Text(), nullable=True),
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['region_id'], ['regions.id'], name=op.f('fk_nodes_region_id_regions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_nodes')),
    sa.UniqueConstraint('name', name=op.f('uq_nodes_name'))
    )
    op.create_index(op.f('ix_nodes_region_id'), 'nodes', ['region_id'], unique=False)
    op.create_table('routing_policies',
    sa.Column('model_id', sa.BigInteger(), nullable=False),
    sa.Column('region_id', sa.BigInteger(), nullable=True),
    sa.Column('policy', sa.String(length=32), nullable=False),
    sa.Column('params', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('slo_ttft_ms', sa.Integer(), nullable=True),
    sa.Column('slo_itl_ms', sa.Integer(), nullable=True),
    sa.Column('max_inflight', sa.Integer(), nullable=True),
    sa.Column('max_queue', sa.Integer(), nullable=True),
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_routing_policies_model_id_models')),
    sa.ForeignKeyConstraint(['region_id'], ['regions.id'], name=op.f('fk_routing_policies_region_id_regions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_routing_policies')),
    sa.UniqueConstraint('name', name=op.f('uq_routing_policies_name'))
    )
    op.create_index(op.f('ix_routing_policies_model_id'), 'routing_policies', ['model_id'], unique=False)
    op.create_index(op.f('ix_routing_policies_region_id'), 'routing_policies', ['region_id'], unique=False)
    op.create_index('uq_routing_policies_model_region', 'routing_policies', ['model_id', sa.text("coalesce(region_id, 0)")], unique=True)
    op.create_table('fallback_peers',
    sa.Column('rule_id', sa.BigInteger(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('region_id', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['region_id'], ['regions.id'], name=op.f('fk_fallback_peers_region_id_regions')),
    sa.ForeignKeyConstraint(['rule_id'], ['fallback_rules.id'], name=op.f('fk_fallback_peers_rule_id_fallback_rules'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('rule_id', 'position', name=op.f('pk_fallback_peers'))
    )
    op.create_index(op.f('ix_fallback_peers_region_id'), 'fallback_peers', ['region_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_fallback_peers_region_id'), table_name='fallback_peers')
    op.drop_table('fallback_peers')
    op.drop_index('uq_routing_policies_model_region', table_name='routing_policies')
    op.drop_index(op.f('ix_routing_policies_region_id'), table_name='routing_policies')
    op.drop_index(op.f('ix_routing_policies_model_id'), table_name='routing_policies')
    op.drop_table('routing_policies')
    op.drop_index(op.f('ix_nodes_region_id'), table_name='nodes')
    op.drop_table('nodes')
    op.drop_index('uq_fallback_rules_scope', table_name='fallback_rules')
    op.drop_index(op.f('ix_fallback_rules_region_id'), table_name='fallback_rules')
    op.drop_index(op.f('ix_fallback_rules_model_id'), table_name='fallback_rules')
    op.drop_table('fallback_rules')
    op.drop_index(op.f('ix_deployments_region_id'), table_name='deployments')
    op.drop_index(op.f('ix_deployments_model_id'), table_name='deployments')
    op.drop_table('deployments')
    op.drop_index(op.f('ix_bootstrap_tokens_region_id'), table_name='bootstrap_tokens')
    op.drop_table('bootstrap_tokens')
    op.drop_index(op.f('ix_regions_cloud_id'), table_name='regions')
    op.drop_table('regions')
    op.drop_index(op.f('ix_api_keys_tenant_id'), table_name='api_keys')
    op.drop_table('api_keys')
    op.drop_table('tenants')
    op.drop_table('principals')
    op.drop_table('models')
    op.drop_table('config_revision')
    op.drop_table('clouds')
    op.drop_index(op.f('ix_audit_events_revision'), table_name='audit_events')
    op.drop_table('audit_events')
