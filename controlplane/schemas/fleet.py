"""Specs of the fleet: clouds, regions, nodes, models, deployments, routing and fallback."""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Annotated, Any, Literal, Self

from meridian_pb.fleet.v1.features import FEATURES
from meridian_pb.fleet.v1.params import params_for
from meridian_pb.fleet.v1.prices import Pricing
from pydantic import Field, ValidationError, model_validator

from controlplane.domain import (
    Capability,
    CascadeSignal,
    EngineBackend,
    FallbackTrigger,
    NodeState,
    PdMode,
    RegionState,
    RoutingPolicyName,
)
from controlplane.schemas.autoscale import AutoscaleSpec
from controlplane.schemas.classes import ClassesSpec, ServiceClassName
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
    utc_offset_h: float | None = Field(
        default=None, ge=-12, le=14, multiple_of=0.25,
        description="its local time's offset from UTC, in hours: batches' lines go first, "
        "and more of them, to regions where it is night",
    )  # fmt: skip


class Gpu(Spec):
    index: int = Field(ge=0, le=255)
    model: Annotated[str, Field(min_length=1, max_length=64)]
    memory_gb: int = Field(ge=1, le=4096)


class NodePoolSpec(Spec):
    """Nodes alike, in one cloud's region, that the capacity planner may grow and shrink:
    their GPU, what a GPU of them costs an hour, and whether they are spot."""

    cloud: Name
    region: Name
    gpu_model: Annotated[str, Field(min_length=1, max_length=64)] = Field(
        description="the GPU its nodes carry, as nodes name it (e.g. H100-80GB)"
    )
    gpus_per_node: int = Field(ge=1, le=64)
    price_per_gpu_hour: float = Field(
        ge=0, le=10_000, description="what one of its GPUs costs an hour (one currency, fleet-wide)"
    )
    spot: bool = Field(default=False, description="preemptible: cheaper, and taken back at times")
    min_nodes: int = Field(default=0, ge=0, le=10_000)
    max_nodes: int = Field(ge=0, le=10_000)
    group: Annotated[str, Field(pattern=r"^[A-Za-z0-9._:@+=/-]{1,255}$")] | None = Field(
        default=None,
        description="the cloud's group of machines the planner resizes: AWS "
        "aws-region/auto-scaling-group; GCP project/zone/manager; Azure "
        "subscription/resource-group/scale-set (unset: its size is the operator's)",
    )

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.min_nodes > self.max_nodes:
            raise ValueError("min_nodes must not exceed max_nodes")
        return self


class NodeSpec(Spec):
    region: Name
    hostname: Annotated[str, Field(pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")]
    gpus: list[Gpu] = Field(default_factory=list, max_length=64)
    state: NodeState = NodeState.ACTIVE
    pool: Name | None = Field(default=None, description="the node pool it belongs to, if any")

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
    pricing: Pricing | None = Field(
        default=None,
        description="its prices, each from its time on, per million tokens in the fleet's "
        "currency (docs/usage.md); null: its usage is recorded unpriced",
    )


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
    autoscale: AutoscaleSpec | None = Field(
        default=None,
        description="engines sized by the capacity planner within these bounds; `replicas` "
        "is then where it starts. Unset: `replicas` engines, fixed",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        scaled = self.autoscale
        if scaled is not None:
            if self.pd_mode is PdMode.DISAGGREGATED:
                raise ValueError("autoscale sizes unified deployments; a disaggregated one "
                                 "keeps its prefill_replicas and decode_replicas")  # fmt: skip
            if self.backend is EngineBackend.EXTERNAL:
                raise ValueError("autoscale starts and stops engines: not external ones")
            if self.replicas is None:
                self.replicas = max(1, scaled.min_replicas)
            if not scaled.min_replicas <= self.replicas <= scaled.max_replicas:
                raise ValueError(
                    f"replicas ({self.replicas}) must be within autoscale's min_replicas "
                    f"({scaled.min_replicas}) and max_replicas ({scaled.max_replicas})"
                )
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
    classes: ClassesSpec | None = Field(
        default=None, description="how its service classes are admitted; null: the defaults"
    )

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


Feature = Literal[FEATURES]  # type: ignore[valid-type]


class TierClassifier(Spec):
    """The built-in classifier's table (agents/router/tiers.py): the score is `bias` plus each
    feature times its weight; `thresholds`, ascending, cut it into the tiers, one fewer than
    there are tiers."""

    bias: float = Field(ge=-1000, le=1000)
    weights: dict[Feature, Annotated[float, Field(ge=-1000, le=1000)]] = Field(
        max_length=len(FEATURES), description="a weight per feature; a feature left out weighs 0"
    )
    thresholds: list[Annotated[float, Field(ge=-1000, le=1000)]] = Field(min_length=1, max_length=7)

    @model_validator(mode="after")
    def _ascending(self) -> Self:
        if any(b <= a for a, b in itertools.pairwise(self.thresholds)):
            raise ValueError("thresholds must be in strictly ascending order")
        return self


class ExternalClassifier(Spec):
    """An HTTP service that chooses the tier: POST {"route", "tiers", "features", "text"}
    answered {"tier": <index>} or {"score": <number>} (cut by the table's thresholds). Past
    `budget_ms` the request goes on with the built-in score."""

    url: HttpUrl
    budget_ms: int = Field(default=20, ge=1, le=2000)


class CascadeSpec(Spec):
    """A cheap tier's answer that shows one of `signals` is asked again of the strongest tier,
    once; the client sees one answer. Non-streamed requests, and streams when
    `buffer_streams` (the client then gets the stream when it has ended)."""

    signals: Annotated[list[CascadeSignal], Unique] = Field(
        default_factory=lambda: list(CascadeSignal), min_length=1, max_length=len(CascadeSignal)
    )
    min_mean_logprob: float = Field(
        default=-1.5, ge=-100, le=0, description="low_logprob: the answer's mean token logprob"
    )
    buffer_streams: bool = False


class TieredRouteSpec(Spec):
    """A virtual model: clients ask for its name; each request is answered by one of `tiers`,
    real models from the cheapest to the strongest."""

    tiers: Annotated[list[Name], Unique] = Field(min_length=2, max_length=8)
    classifier: TierClassifier | None = Field(default=None, description="null: the built-in table")
    external_classifier: ExternalClassifier | None = None
    cascade: CascadeSpec | None = None
    capacity_moves: bool = Field(
        default=True,
        description="a request whose tier would break its SLO moves to the next tier "
        "(down for tenants that opted in, above their floor; else up)",
    )
    conversation_ttl_s: int = Field(
        default=1800, ge=0, le=86_400, description="how long a conversation keeps its tier"
    )

    @model_validator(mode="after")
    def _table_fits(self) -> Self:
        if self.classifier is not None and len(self.classifier.thresholds) != len(self.tiers) - 1:
            raise ValueError(
                f"classifier.thresholds: {len(self.tiers)} tiers need "
                f"{len(self.tiers) - 1} thresholds"
            )
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
    classes: Annotated[list[ServiceClassName], Unique] = Field(
        default_factory=lambda: [ServiceClassName.INTERACTIVE, ServiceClassName.STANDARD],
        min_length=1,
        max_length=len(ServiceClassName),
        description="the service classes it escalates; a region's rules of one scope (model "
        "and tenant tier) name each class at most once",
    )


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


class NodePoolOut(Meta, NodePoolSpec):
    pass


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


class TieredRouteOut(Meta, TieredRouteSpec):
    pass
