"""Rollouts: the policy, the intent declared at each revision, what each target holds, and
the rollouts themselves, so that a new leader resumes one where the old one left it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Float, Integer, String, Text, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db.base import Base, NamedRow

Json = dict[str, Any]


class RolloutPolicyRow(NamedRow):
    __tablename__ = "rollout_policies"

    strategy: Mapped[str] = mapped_column(String(16))
    canary: Mapped[str] = mapped_column(String(16))
    canary_region: Mapped[str | None] = mapped_column(String(63))
    waves: Mapped[list[Json]] = mapped_column(JSONB)
    bake_s: Mapped[float] = mapped_column(Float)
    checks: Mapped[Json] = mapped_column(JSONB)


class IntentRow(Base):
    """The fleet's intent (models, deployments, routing policies, fallback rules) as declared
    at a revision that changed it: what a target holding that revision is compiled from."""

    __tablename__ = "intents"

    revision: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    doc: Mapped[Json] = mapped_column(JSONB)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class HoldingRow(Base):
    """The intent revision a target holds while a rollout has not reached it, or after one was
    rolled back. `region:<name>` or `node:<name>`; a node's row overrides its region's, and a
    region without a row holds the newest intent."""

    __tablename__ = "holdings"

    target: Mapped[str] = mapped_column(String(80), primary_key=True)
    revision: Mapped[int] = mapped_column(BigInteger)


class RolloutRow(Base):
    __tablename__ = "rollouts"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    revision: Mapped[int] = mapped_column(BigInteger, index=True)  # the intent rolling out
    base: Mapped[int] = mapped_column(BigInteger)  # the last good intent it started from
    state: Mapped[str] = mapped_column(String(16), index=True)
    actor: Mapped[str] = mapped_column(String(320))
    policy: Mapped[Json] = mapped_column(JSONB)
    waves: Mapped[list[Json]] = mapped_column(JSONB, default=list)
    wave: Mapped[int] = mapped_column(Integer, default=-1)  # -1: not begun
    wave_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    pushed_revision: Mapped[int | None] = mapped_column(BigInteger)  # the wave's revision
    before: Mapped[Json] = mapped_column(JSONB, default=dict)  # counters as it began
    at_wave: Mapped[Json] = mapped_column(JSONB, default=dict)  # counters as the wave began
    checks: Mapped[list[Json]] = mapped_column(JSONB, default=list)  # the latest verdicts
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
