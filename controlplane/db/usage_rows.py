"""The usage ledger's rows: one per request (or hop, or refusal), as the agents recorded
them, stored once by `id` (agents/ledger). The table is partitioned by month of
`started_at`; each month's partition is made, in schema `usage_parts`, when its first record
arrives (controlplane/services/usage/store.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, DateTime, Index, Integer, String, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db.base import Base

PARTITIONS_SCHEMA = "usage_parts"


class UsageRecordRow(Base):
    __tablename__ = "usage_records"
    __table_args__ = (
        Index("ix_usage_records_tenant_started", "tenant", "started_at"),
        Index("ix_usage_records_started", "started_at"),  # a report's ends, an export
        {"postgresql_partition_by": "RANGE (started_at)"},
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    ended_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    request_id: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(8))  # served | refused | hop | carried | meter
    tenant: Mapped[str] = mapped_column(String(63))
    api_key: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(255))
    answered_model: Mapped[str] = mapped_column(String(255))
    region: Mapped[str] = mapped_column(String(63))
    node: Mapped[str] = mapped_column(String(63))
    service_class: Mapped[str] = mapped_column(String(16))
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    cached_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)
    outcome: Mapped[str] = mapped_column(String(64))
    status: Mapped[int] = mapped_column(Integer)
    came_from: Mapped[str] = mapped_column(String(63))
    escalated_to: Mapped[str] = mapped_column(String(63))
    calls: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB, nullable=True)
    # its price in billionths of the fleet's currency; null: its model had none
    cost_nanos: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # its tokens counted from what its client got (the engine's usage never came)
    estimated: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    # the engine's worker that served it; a `meter` record's: the engine whose counters it holds
    worker: Mapped[str] = mapped_column(String(255), default="", server_default="")
    stored_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class UsageQuarterRow(Base):
    """The ledger summed by quarter hour (UTC, `at` its start) and by tenant, key, model,
    region and class: what the reports read for a period on whole quarter hours, in any time
    zone (every zone's offset is whole quarter hours; controlplane/services/usage). Each
    record is added once, as it is stored."""

    __tablename__ = "usage_quarters"

    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(63), primary_key=True)
    api_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(255), primary_key=True)
    region: Mapped[str] = mapped_column(String(63), primary_key=True)
    service_class: Mapped[str] = mapped_column(String(16), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    refused: Mapped[int] = mapped_column(BigInteger)
    unpriced: Mapped[int] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    cached_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)
    cost_nanos: Mapped[int] = mapped_column(BigInteger)
