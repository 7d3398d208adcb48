"""Rows of identity and access: tenants, API keys, principals, bootstrap tokens."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, DateTime, Float, ForeignKey, Integer, String
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship

from controlplane.db.base import NamedRow
from controlplane.db.fleet_rows import NodePoolRow, RegionRow


class TenantRow(NamedRow):
    __tablename__ = "tenants"

    tier: Mapped[str] = mapped_column(String(32))
    allowed_jurisdictions: Mapped[list[str] | None] = mapped_column(JSONB)
    requests_per_minute: Mapped[int | None] = mapped_column(Integer)
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger)
    debug_routes: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    disabled: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    tiering: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    tier_floor: Mapped[str | None] = mapped_column(String(63))  # a model's name
    max_concurrency: Mapped[int | None] = mapped_column(Integer)
    weight: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    default_class: Mapped[str] = mapped_column(
        String(16), default="standard", server_default="standard"
    )
    class_ceiling: Mapped[str] = mapped_column(
        String(16), default="standard", server_default="standard"
    )
    price_discount_percent: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    budgets: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, default=list, server_default="[]")


class ApiKeyRow(NamedRow):
    __tablename__ = "api_keys"

    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # the secret before its last rotation (same prefix), accepted until previous_expires_at
    previous_key_hash: Mapped[str | None] = mapped_column(String(64))
    previous_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    tenant: Mapped[TenantRow] = relationship(lazy="joined")


class PrincipalRow(NamedRow):
    __tablename__ = "principals"

    role: Mapped[str] = mapped_column(String(16))
    tenant_id: Mapped[int | None] = mapped_column(ForeignKey("tenants.id"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # the token before its last rotation, accepted until previous_expires_at (the overlap)
    previous_token_hash: Mapped[str | None] = mapped_column(String(64))
    previous_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    tenant: Mapped[TenantRow | None] = relationship(lazy="joined")  # a tenant admin's


class BootstrapTokenRow(NamedRow):
    __tablename__ = "bootstrap_tokens"

    region_id: Mapped[int] = mapped_column(ForeignKey("regions.id"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    pool_id: Mapped[int | None] = mapped_column(
        ForeignKey("node_pools.id", ondelete="SET NULL"), index=True
    )

    region: Mapped[RegionRow] = relationship(lazy="joined")
    pool: Mapped[NodePoolRow | None] = relationship(lazy="joined")
