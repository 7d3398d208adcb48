"""What the capacity planner decided: engines per autoscaled deployment (a fact, like a node's
state, that reaches every target at once), and the planner's own state."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Integer,
    String,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db.base import Base


class EnginePlanRow(Base):
    """The engines the planner runs for one deployment with `autoscale`; none: its
    `replicas`. Deleted with the deployment."""

    __tablename__ = "engine_plans"

    deployment_id: Mapped[int] = mapped_column(
        ForeignKey("deployments.id", ondelete="CASCADE"), primary_key=True
    )
    engines: Mapped[int] = mapped_column(Integer)
    changed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    reason: Mapped[str] = mapped_column(Text, default="")


class PlannerStateRow(Base):
    """A single row: whether an operator paused the planner, and what it last decided, for
    every replica's API to show and for the next leader to start from (the daily shapes it
    learned)."""

    __tablename__ = "planner_state"
    __table_args__ = (CheckConstraint("id = 1", name="singleton"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, default=1)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    paused_by: Mapped[str | None] = mapped_column(String(320))
    paused_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_run_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_run_revision: Mapped[int | None] = mapped_column(BigInteger)
    decisions: Mapped[list[Any]] = mapped_column(JSONB, default=list)
    shapes: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)


class AdapterPlanRow(Base):
    """The engines of a region that keep a LoRA adapter loaded, as the leader plans them from
    demand (controlplane/services/residency.py): a fact, like the engine plans. Deleted with
    the adapter or the region."""

    __tablename__ = "adapter_plans"

    adapter_id: Mapped[int] = mapped_column(
        ForeignKey("adapters.id", ondelete="CASCADE"), primary_key=True
    )
    region_id: Mapped[int] = mapped_column(
        ForeignKey("regions.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    engines: Mapped[int] = mapped_column(Integer)
    changed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    reason: Mapped[str] = mapped_column(Text, default="")
