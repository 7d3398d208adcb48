"""The rollout policy: how a declared change reaches the fleet, in waves, judged as it goes.

A fleet that declares none is governed by the default below; `strategy: immediate` sends
every change everywhere at once (then judges it, and rolls it back, all the same).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Self

from pydantic import Field, model_validator

from controlplane.schemas.common import Meta, Name, Spec, Unique

ROLLOUT_POLICY = "default"  # the one policy a fleet has: its name


class Strategy(StrEnum):
    WAVES = "waves"
    IMMEDIATE = "immediate"


class Canary(StrEnum):
    NODE = "node"  # one node of the canary region first
    REGION = "region"  # the canary region's agents all at once


Seconds = Annotated[float, Field(ge=0, le=86_400)]


class WaveSpec(Spec):
    """One wave after the canary region: regions by name, by count, or by percentage of the
    regions still left. Regions no wave names go in a last wave of their own."""

    regions: Annotated[list[Name], Unique] | None = Field(
        default=None, min_length=1, max_length=1000
    )
    count: int | None = Field(default=None, ge=1, le=10_000)
    percent: int | None = Field(default=None, ge=1, le=100)
    bake_s: Seconds | None = Field(default=None, description="null: the policy's bake_s")

    @model_validator(mode="after")
    def _one_way(self) -> Self:
        given = [f for f in ("regions", "count", "percent") if getattr(self, f) is not None]
        if len(given) != 1:
            raise ValueError("a wave names exactly one of regions, count or percent")
        return self


class RolloutChecks(Spec):
    """What must hold for the updated targets, against those not yet updated over the same
    minutes (or, when every target is updated, against their own minutes before)."""

    min_requests: int = Field(
        default=20, ge=1, le=1_000_000,
        description="answers a side needs, per model, before a rate or latency is judged",
    )  # fmt: skip
    wait_for_traffic_s: Seconds = Field(
        default=600, description="past the bake, how long a check may wait for traffic; "
        "then the rollout pauses for an operator (it never passes by default)",
    )  # fmt: skip
    error_rate: float = Field(
        default=0.05, ge=0, le=1,
        description="5xx and no_healthy_worker: the most the updated share may exceed the "
        "baseline's by (and twice it)",
    )  # fmt: skip
    refusal_rate: float = Field(
        default=0.05, ge=0, le=1,
        description="queue_full and overloaded (not a tenant's own limits): the same margin",
    )  # fmt: skip
    escalated_share: float = Field(
        default=0.05, ge=0, le=1, description="answers sent to a peer: the same margin"
    )
    slo_miss_rate: float = Field(
        default=0.05, ge=0, le=1,
        description="streamed answers whose first token came past the route's TTFT SLO (not "
        "those that waited on another tenant's load): the same margin",
    )  # fmt: skip
    latency_ratio: float = Field(
        default=1.5, ge=1, le=100,
        description="TTFT and ITL p99 of a route without that SLO fail past this times the "
        "baseline's",
    )  # fmt: skip
    max_restarts: int = Field(
        default=2, ge=1, le=1000, description="engine restarts on an updated target in a wave"
    )


class RolloutPolicySpec(Spec):
    strategy: Strategy = Strategy.WAVES
    canary: Canary = Canary.NODE
    canary_region: Name | None = Field(
        default=None, description="null: the active region with the fewest GPUs"
    )
    waves: list[WaveSpec] = Field(
        default_factory=lambda: [WaveSpec(count=1), WaveSpec(percent=100)], max_length=64
    )
    bake_s: Seconds = Field(default=60, description="how long each wave is watched")
    checks: RolloutChecks = Field(default_factory=RolloutChecks)


class RolloutPolicyOut(Meta, RolloutPolicySpec):
    pass
