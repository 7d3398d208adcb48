"""the capacity planner: engines per autoscaled deployment, and the planner's state (paused or
not, what it last decided, the daily shapes it learned)

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27 03:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('engine_plans',
    sa.Column('deployment_id', sa.BigInteger(), nullable=False),
    sa.Column('engines', sa.Integer(), nullable=False),
    sa.Column('changed_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['deployment_id'], ['deployments.id'], name=op.f('fk_engine_plans_deployment_id_deployments'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('deployment_id', name=op.f('pk_engine_plans'))
    )
    op.create_table('planner_state',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('paused', sa.Boolean(), nullable=False),
    sa.Column('paused_by', sa.String(length=63), nullable=True),
    sa.Column('paused_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_run_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_run_revision', sa.BigInteger(), nullable=True),
    sa.Column('decisions', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('shapes', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.CheckConstraint('id = 1', name=op.f('ck_planner_state_singleton')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_planner_state'))
    )


def downgrade() -> None:
    op.drop_table('planner_state')
    op.drop_table('engine_plans')
