"""A deployment's `autoscale` block: what the capacity planner may decide for its engines."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from controlplane.schemas.common import Spec


class AutoscaleSpec(Spec):
    """What the capacity planner may decide for a deployment (its region's engines)."""

    min_replicas: int = Field(ge=0, le=1024, description="engines it keeps at the least")
    max_replicas: int = Field(ge=1, le=1024, description="engines it runs at the most")
    target_attainment: float = Field(
        default=0.95,
        ge=0.5,
        le=0.999,
        description="the share of timed answers within the routing policy's TTFT SLO to keep",
    )
    headroom: float = Field(
        default=0.2, ge=0, le=4, description="capacity kept over the forecast demand, a share"
    )
    scale_to_zero: bool = Field(
        default=False,
        description="whether it may run no engine while nothing asks for its model here "
        "(requests then go to a region that serves it, within residency, while one starts)",
    )
    wake_wait_s: int = Field(
        default=30,
        ge=1,
        le=600,
        description="with scale_to_zero: how long a request no peer region takes waits here "
        "for an engine to start, before it is answered 503 with Retry-After",
    )
    local_share: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="the share of its demand its own engines are planned for at least; the "
        "rest may be planned in a peer region whose GPUs cost a tenth less or more, which "
        "serves it by escalation (a fallback rule with the overload trigger, for its model "
        "and every tier, within its jurisdiction). 1: none leaves by plan (each answer "
        "served elsewhere pays the round trip between regions)",
    )

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must not exceed max_replicas")
        if self.min_replicas == 0 and not self.scale_to_zero:
            raise ValueError("min_replicas 0 needs scale_to_zero: true")
        return self
