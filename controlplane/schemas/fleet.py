"""Specs of the fleet: clouds, regions, nodes, models, deployments, routing and fallback."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Self

from pydantic import Field, ValidationError, model_validator

from agents.router.params import params_for
from controlplane.domain import (
    Capability,
    EngineBackend,
    FallbackTrigger,
    NodeState,
    PdMode,
    RegionState,
    RoutingPolicyName,
)
from controlplane.schemas.common import (
    ArgKey,
    HttpUrl,
    Meta,
    Name,
    Scalar,
    Slug,
    Spec,
    Unique,
)


class CloudSpec(Spec):
    provider: Slug = Field(description="aws, gcp, azure, oci, onprem, ...")
    description: Annotated[str, Field(max_length=500)] = ""


class RegionSpec(Spec):
    cloud: Name
    geography: Slug = Field(description="where it is, e.g. us-east or eu-west")
    jurisdiction: Slug = Field(description="data-residency jurisdiction, e.g. us or eu")
    state: RegionState = RegionState.ACTIVE
    gateway_url: HttpUrl | None = Field(default=None, description="the region's public gateway")


class Gpu(Spec):
    index: int = Field(ge=0, le=255)
    model: Annotated[str, Field(min_length=1, max_length=64)]
    memory_gb: int = Field(ge=1, le=4096)


class NodeSpec(Spec):
    region: Name
    hostname: Annotated[str, Field(pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")]
    gpus: list[Gpu] = Field(default_factory=list, max_length=64)
    state: NodeState = NodeState.ACTIVE

    @model_validator(mode="after")
    def _distinct_gpu_indexes(self) -> Self:
        indexes = [gpu.index for gpu in self.gpus]
        if len(set(indexes)) != len(indexes):
            raise ValueError("gpus: two GPUs have the same index")
        return self


class NodeStatus(Spec):
    health: str = Field(description="unknown | up | down: whether an agent holds a stream")
    health_changed_at: datetime | None
    last_heartbeat_at: datetime | None
    desired_revision: int | None
    applied_revision: int | None
    last_nack_reason: str | None


class ModelSpec(Spec):
    source: Annotated[str, Field(min_length=1, max_length=1024)] = Field(
        description="model path or repository id the engines load"
    )
    context_length: int = Field(ge=1, le=10_000_000)
    capabilities: Annotated[list[Capability], Unique] = Field(
        default_factory=lambda: [Capability.CHAT, Capability.COMPLETION],
        max_length=len(Capability),
    )
    min_gpu_memory_gb: int = Field(default=0, ge=0, le=4096)


class DeploymentSpec(Spec):
    model: Name
    region: Name
    backend: EngineBackend = EngineBackend.SGLANG
    replicas: int | None = Field(
        default=None,
        ge=0,
        le=1024,
        description="unified engines (default 1); in disaggregated mode prefill + decode",
    )
    tp_size: int = Field(default=1, ge=1, le=64)
    dp_size: int = Field(default=1, ge=1, le=64)
    pd_mode: PdMode = PdMode.UNIFIED
    prefill_replicas: int = Field(default=0, ge=0, le=1024)
    decode_replicas: int = Field(default=0, ge=0, le=1024)
    engine_args: dict[ArgKey, Scalar] = Field(
        default_factory=dict,
        max_length=64,
        description="extra launch_server flags, without the leading --",
    )
    external_urls: Annotated[list[HttpUrl], Unique] = Field(default_factory=list, max_length=64)
    drain_timeout_s: float = Field(
        default=120.0,
        ge=0,
        le=3600,
        description="how long an engine that is stopped or replaced may finish its running "
        "requests (it takes no new ones); those still running then go on on another engine",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.pd_mode is PdMode.DISAGGREGATED:
            if self.prefill_replicas < 1 or self.decode_replicas < 1:
                raise ValueError("disaggregated mode needs prefill_replicas and decode_replicas")
            total = self.prefill_replicas + self.decode_replicas
            if self.replicas is not None and self.replicas != total:
                raise ValueError("replicas must equal prefill_replicas + decode_replicas")
            self.replicas = total
        else:
            if self.prefill_replicas or self.decode_replicas:
                raise ValueError("prefill_replicas and decode_replicas need disaggregated mode")
            if self.replicas is None:
                self.replicas = 1
        if self.backend is EngineBackend.EXTERNAL:
            if not self.external_urls:
                raise ValueError("the external backend needs external_urls")
            if self.pd_mode is PdMode.DISAGGREGATED:
                raise ValueError("the external backend serves unified engines only")
        elif self.external_urls:
            raise ValueError(f"external_urls are for the external backend, not {self.backend}")
        return self


class RoutingPolicySpec(Spec):
    model: Name
    region: Name | None = Field(default=None, description="null: every region of the model")
    policy: RoutingPolicyName = RoutingPolicyName.COST
    params: dict[ArgKey, Scalar] = Field(default_factory=dict, max_length=32)
    slo_ttft_ms: int | None = Field(default=None, ge=1, le=600_000)
    slo_itl_ms: int | None = Field(default=None, ge=1, le=60_000)
    max_inflight: int | None = Field(default=None, ge=1, le=1_000_000)
    max_queue: int | None = Field(default=None, ge=0, le=1_000_000)

    @model_validator(mode="after")
    def _params_fit_the_policy(self) -> Self:
        """The agents validate a policy's parameters as they apply a snapshot, and refuse a
        snapshot with bad ones; checked here too, so that a bad one is never committed."""
        try:
            params_for(self.policy.value, dict(self.params))
        except ValidationError as error:
            problems = "; ".join(
                f"params.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()
            )
            raise ValueError(f"{self.policy.value}: {problems}") from None
        return self


class FallbackThresholds(Spec):
    ttft_ms: int | None = Field(default=None, ge=1, le=600_000)
    queue_depth: int | None = Field(default=None, ge=0, le=1_000_000)
    error_rate: float | None = Field(default=None, ge=0.0, le=1.0)


class FallbackRuleSpec(Spec):
    region: Name
    model: Name | None = Field(default=None, description="null: every model")
    tenant_tier: Slug | None = Field(default=None, description="null: every tier")
    peers: Annotated[list[Name], Unique] = Field(
        min_length=1, max_length=32, description="peer regions, in order of preference"
    )
    triggers: Annotated[list[FallbackTrigger], Unique] = Field(
        default_factory=lambda: [FallbackTrigger.OVERLOAD, FallbackTrigger.FAILURE],
        min_length=1,
        max_length=len(FallbackTrigger),
    )
    thresholds: FallbackThresholds = Field(default_factory=FallbackThresholds)


class CloudOut(Meta, CloudSpec):
    pass


class RegionStatus(Spec):
    health: str = Field(description="unknown | up | degraded | down, from its nodes")
    load: dict[str, Any] | None = Field(
        description="capacity and load, rolled up from the nodes' latest telemetry"
    )


class RegionOut(Meta, RegionSpec):
    status: RegionStatus


class NodeOut(Meta, NodeSpec):
    status: NodeStatus


class ModelStatus(Spec):
    quality: dict[str, Any] | None = Field(
        default=None,
        description="the quality guard's figures for the model in each region (answers "
        "flagged by each detector, canary scores, workers held) and the regions flagged "
        "against the others, rolled up by the leader",
    )


class ModelOut(Meta, ModelSpec):
    status: ModelStatus | None = None


class DeploymentOut(Meta, DeploymentSpec):
    pass


class RoutingPolicyOut(Meta, RoutingPolicySpec):
    pass


class FallbackRuleOut(Meta, FallbackRuleSpec):
    pass
