"""the names of who acted (audit events, rollouts' actors, the planner's pauser) are as long
as a person signed in through the identity provider may be: oidc:<email>

Revision ID: 0030
Revises: 0029
Create Date: 2026-11-29 09:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0030'
down_revision = '0029'
branch_labels = None
depends_on = None

COLUMNS = (("audit_events", "principal", False), ("rollouts", "actor", False),
           ("planner_state", "paused_by", True))


def upgrade() -> None:
    for table, column, nullable in COLUMNS:
        op.alter_column(table, column, type_=sa.String(length=320),
                        existing_type=sa.String(length=63), existing_nullable=nullable)


def downgrade() -> None:
    for table, column, nullable in COLUMNS:
        op.alter_column(table, column, type_=sa.String(length=63),
                        existing_type=sa.String(length=320), existing_nullable=nullable)
