"""Rows of the global quotas: what each replica's agents ask for, and the leases the leader
gives them. Neither is part of the fleet's declared state: they carry no revision."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Sequence, String
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db.base import Base

Json = dict[str, Any]
LEASE_VERSION = Sequence("quota_lease_version")


class QuotaDemandRow(Base):
    """The newest demand report of every agent streaming to one replica, written by it."""

    __tablename__ = "quota_demand"

    replica: Mapped[str] = mapped_column(String(64), primary_key=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    data: Mapped[Json] = mapped_column(JSONB)  # node -> {"region", "at", "tenants": {...}}


class QuotaLeaseRow(Base):
    """One tenant's leases, per agent, as the leader last gave them; `version` moves forward
    with every change (from one sequence), so that replicas read only what changed."""

    __tablename__ = "quota_leases"

    tenant: Mapped[str] = mapped_column(String(63), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, index=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    data: Mapped[Json] = mapped_column(JSONB)  # {"quota": {...}, "leases": {node: {...}}}
