"""Rows of the fleet: clouds, regions, nodes, models, deployments, routing and fallback."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship

from controlplane.db.base import Base, NamedRow

if TYPE_CHECKING:
    from controlplane.db.agent_rows import ModelQualityRow, RegionLoadRow

Json = dict[str, Any]


class CloudRow(NamedRow):
    __tablename__ = "clouds"

    provider: Mapped[str] = mapped_column(String(32))
    description: Mapped[str] = mapped_column(Text, default="")


class RegionRow(NamedRow):
    __tablename__ = "regions"

    cloud_id: Mapped[int] = mapped_column(ForeignKey("clouds.id"), index=True)
    geography: Mapped[str] = mapped_column(String(63))
    jurisdiction: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16))
    gateway_url: Mapped[str | None] = mapped_column(Text)
    utc_offset_h: Mapped[float | None] = mapped_column(Float)  # its local time, for batches
    # A seed stored in clear before keys were sealed (migration 0028): the control plane seals
    # it into signing_keys at start and clears it here (services/sealing/signing.py).
    signing_key: Mapped[bytes | None] = mapped_column(LargeBinary(32))

    cloud: Mapped[CloudRow] = relationship(lazy="joined")
    # The leader's latest rollup of the region (agent_rows.RegionLoadRow); read-only here.
    load: Mapped[RegionLoadRow | None] = relationship(lazy="selectin", viewonly=True, uselist=False)


class NodePoolRow(NamedRow):
    __tablename__ = "node_pools"

    cloud_id: Mapped[int] = mapped_column(ForeignKey("clouds.id"), index=True)
    region_id: Mapped[int] = mapped_column(ForeignKey("regions.id"), index=True)
    gpu_model: Mapped[str] = mapped_column(String(64))
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    price_per_gpu_hour: Mapped[float] = mapped_column(Float)
    spot: Mapped[bool] = mapped_column(Boolean, default=False)
    min_nodes: Mapped[int] = mapped_column(Integer, default=0)
    max_nodes: Mapped[int] = mapped_column(Integer)
    group: Mapped[str | None] = mapped_column(String(255))

    cloud: Mapped[CloudRow] = relationship(lazy="joined")
    region: Mapped[RegionRow] = relationship(lazy="joined")


class NodeRow(NamedRow):
    __tablename__ = "nodes"

    region_id: Mapped[int] = mapped_column(ForeignKey("regions.id"), index=True)
    pool_id: Mapped[int | None] = mapped_column(ForeignKey("node_pools.id"), index=True)
    hostname: Mapped[str] = mapped_column(String(253))
    gpus: Mapped[list[Json]] = mapped_column(JSONB, default=list)
    state: Mapped[str] = mapped_column(String(16))
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    desired_revision: Mapped[int | None] = mapped_column(BigInteger)
    applied_revision: Mapped[int | None] = mapped_column(BigInteger)
    last_nack_reason: Mapped[str | None] = mapped_column(Text)
    # Observed by the liveness sweeper, not set by operators: unknown | up | down.
    health: Mapped[str] = mapped_column(String(16), default="unknown", server_default="unknown")
    health_changed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    region: Mapped[RegionRow] = relationship(lazy="joined")
    pool: Mapped[NodePoolRow | None] = relationship(lazy="joined")


# The Core table of nodes: bulk status writes (acks, heartbeats, health) go through it as
# one executemany, without the ORM's per-object bookkeeping.
NODES = cast(Table, NodeRow.__table__)


class ModelRow(NamedRow):
    __tablename__ = "models"

    source: Mapped[str] = mapped_column(Text)
    context_length: Mapped[int] = mapped_column(Integer)
    capabilities: Mapped[list[str]] = mapped_column(JSONB, default=list)
    min_gpu_memory_gb: Mapped[int] = mapped_column(Integer)
    pricing: Mapped[dict[str, Any] | None] = mapped_column(JSONB)  # prices.Pricing, as JSON

    # The leader's latest comparison of the model across regions (agent_rows.ModelQualityRow)
    quality: Mapped[ModelQualityRow | None] = relationship(
        lazy="selectin", viewonly=True, uselist=False
    )


class DeploymentRow(NamedRow):
    __tablename__ = "deployments"
    __table_args__ = (UniqueConstraint("model_id", "region_id"),)

    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), index=True)
    region_id: Mapped[int] = mapped_column(ForeignKey("regions.id"), index=True)
    backend: Mapped[str] = mapped_column(String(16))
    replicas: Mapped[int] = mapped_column(Integer)
    tp_size: Mapped[int] = mapped_column(Integer)
    dp_size: Mapped[int] = mapped_column(Integer)
    pd_mode: Mapped[str] = mapped_column(String(16))
    prefill_replicas: Mapped[int] = mapped_column(Integer, default=0)
    decode_replicas: Mapped[int] = mapped_column(Integer, default=0)
    engine_args: Mapped[Json] = mapped_column(JSONB, default=dict)
    external_urls: Mapped[list[str]] = mapped_column(JSONB, default=list)
    drain_timeout_s: Mapped[float] = mapped_column(Float, default=120.0, server_default="120")
    autoscale: Mapped[Json | None] = mapped_column(JSONB, nullable=True)  # AutoscaleSpec

    model: Mapped[ModelRow] = relationship(lazy="joined")
    region: Mapped[RegionRow] = relationship(lazy="joined")


class EngineSlotRow(Base):
    """Where an engine was placed: its node, GPUs and port, kept so that engines stay put.

    Written in the same transaction as the change that placed it; a deployment's or a node's
    deletion takes its slots along.
    """

    __tablename__ = "engine_slots"
    __table_args__ = (UniqueConstraint("node_id", "port"),)

    engine_id: Mapped[str] = mapped_column(String(160), primary_key=True)
    deployment_id: Mapped[int] = mapped_column(
        ForeignKey("deployments.id", ondelete="CASCADE"), index=True
    )
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    gpu_indexes: Mapped[list[int]] = mapped_column(JSONB)
    port: Mapped[int] = mapped_column(Integer)


class RoutingPolicyRow(NamedRow):
    __tablename__ = "routing_policies"
    __table_args__ = (
        Index(
            "uq_routing_policies_model_region",
            "model_id",
            text("coalesce(region_id, 0)"),
            unique=True,
        ),
    )

    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), index=True)
    region_id: Mapped[int | None] = mapped_column(ForeignKey("regions.id"), index=True)
    policy: Mapped[str] = mapped_column(String(32))
    params: Mapped[Json] = mapped_column(JSONB, default=dict)
    slo_ttft_ms: Mapped[int | None] = mapped_column(Integer)
    slo_itl_ms: Mapped[int | None] = mapped_column(Integer)
    max_inflight: Mapped[int | None] = mapped_column(Integer)
    max_queue: Mapped[int | None] = mapped_column(Integer)
    classes: Mapped[Json | None] = mapped_column(JSONB)

    model: Mapped[ModelRow] = relationship(lazy="joined")
    region: Mapped[RegionRow | None] = relationship(lazy="joined")


class FallbackRuleRow(NamedRow):
    __tablename__ = "fallback_rules"
    __table_args__ = (
        Index(
            "ix_fallback_rules_scope",
            "region_id",
            text("coalesce(model_id, 0)"),
            text("coalesce(tenant_tier, '')"),
        ),
    )

    region_id: Mapped[int] = mapped_column(ForeignKey("regions.id"), index=True)
    model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id"), index=True)
    tenant_tier: Mapped[str | None] = mapped_column(String(32))
    triggers: Mapped[list[str]] = mapped_column(JSONB, default=list)
    thresholds: Mapped[Json] = mapped_column(JSONB, default=dict)
    classes: Mapped[list[str]] = mapped_column(
        JSONB,
        default=lambda: ["interactive", "standard"],
        server_default=text("""'["interactive", "standard"]'::jsonb"""),
    )

    region: Mapped[RegionRow] = relationship(lazy="joined", foreign_keys=[region_id])
    model: Mapped[ModelRow | None] = relationship(lazy="joined")
    peers: Mapped[list[FallbackPeerRow]] = relationship(
        lazy="selectin",
        order_by="FallbackPeerRow.position",
        cascade="all, delete-orphan",
    )


class TieredRouteRow(NamedRow):
    """A virtual model, answered by one of its tiers (real models, by name: a tier whose
    model is gone is left out where the route is compiled)."""

    __tablename__ = "tiered_routes"

    tiers: Mapped[list[str]] = mapped_column(JSONB)
    classifier: Mapped[Json | None] = mapped_column(JSONB)
    external_classifier: Mapped[Json | None] = mapped_column(JSONB)
    cascade: Mapped[Json | None] = mapped_column(JSONB)
    capacity_moves: Mapped[bool] = mapped_column(Boolean, default=True)
    conversation_ttl_s: Mapped[int] = mapped_column(Integer)


class FallbackPeerRow(Base):
    """One peer region in a fallback chain, at its position."""

    __tablename__ = "fallback_peers"

    rule_id: Mapped[int] = mapped_column(
        ForeignKey("fallback_rules.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    region_id: Mapped[int] = mapped_column(ForeignKey("regions.id"), index=True)

    region: Mapped[RegionRow] = relationship(lazy="joined")


class AdapterRow(NamedRow):
    """A LoRA adapter of a model, for the tenants it names (by name, as a tiered route names
    its tiers: a tenant deleted is taken out of the list, controlplane/services/adapter_kind)."""

    __tablename__ = "adapters"

    base_model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), index=True)
    source: Mapped[str] = mapped_column(Text)
    digest: Mapped[str | None] = mapped_column(String(71))  # sha256: and 64 hex digits
    rank: Mapped[int] = mapped_column(Integer)
    tenants: Mapped[list[str]] = mapped_column(JSONB, default=list)

    base_model: Mapped[ModelRow] = relationship(lazy="joined")
