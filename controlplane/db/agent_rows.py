"""Rows of the agents: their credentials, their telemetry, and what it adds up to per region."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, ForeignKey, Index, String
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship

from controlplane.db.base import Base, NamedRow
from controlplane.db.fleet_rows import ModelRow, NodeRow, RegionRow

Json = dict[str, Any]


class AgentRow(NamedRow):
    """The agent that holds a node: one per node; registering again replaces the credential."""

    __tablename__ = "agents"

    node_id: Mapped[int] = mapped_column(
        ForeignKey("nodes.id", ondelete="CASCADE"), unique=True, index=True
    )
    credential_hash: Mapped[str] = mapped_column(String(64), unique=True)
    agent_version: Mapped[str] = mapped_column(String(64), default="")
    registered_with: Mapped[str | None] = mapped_column(String(63))

    node: Mapped[NodeRow] = relationship(lazy="joined")


class NodeTelemetryRow(Base):
    """The latest heartbeat of a node."""

    __tablename__ = "node_telemetry"

    node_id: Mapped[int] = mapped_column(
        ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True
    )
    observed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    data: Mapped[Json] = mapped_column(JSONB)


class TelemetrySampleRow(Base):
    """A short rolling history of heartbeats; the leader prunes what is older than the window."""

    __tablename__ = "telemetry_samples"
    __table_args__ = (Index("ix_telemetry_samples_node_at", "node_id", "observed_at"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    observed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    data: Mapped[Json] = mapped_column(JSONB)


class RegionLoadRow(Base):
    """A region's capacity and load, rolled up by the leader from its nodes' latest telemetry."""

    __tablename__ = "region_load"

    region_id: Mapped[int] = mapped_column(
        ForeignKey("regions.id", ondelete="CASCADE"), primary_key=True
    )
    health: Mapped[str] = mapped_column(String(16))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    data: Mapped[Json] = mapped_column(JSONB)

    region: Mapped[RegionRow] = relationship(lazy="joined")


class ModelQualityRow(Base):
    """The quality guard's figures for a model in every region, and the regions flagged
    against the others (controlplane/services/quality.py), rolled up by the leader."""

    __tablename__ = "model_quality"

    model_id: Mapped[int] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    data: Mapped[Json] = mapped_column(JSONB)

    model: Mapped[ModelRow] = relationship(lazy="joined")
