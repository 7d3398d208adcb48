"""What the compiler reads (the fleet at a revision) and writes (one region's snapshot)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from controlplane.domain import EngineBackend, FallbackTrigger, PdMode, RegionState
from controlplane.schemas.access import TenantSpec
from controlplane.schemas.adapters import AdapterSpec
from controlplane.schemas.fleet import (
    CloudSpec,
    DeploymentSpec,
    FallbackRuleSpec,
    FallbackThresholds,
    Gpu,
    ModelSpec,
    NodePoolSpec,
    NodeSpec,
    RegionSpec,
    RoutingPolicySpec,
    TieredRouteSpec,
)
from controlplane.schemas.rollout import RolloutPolicySpec


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ApiKeyState(Frozen):
    tenant: str
    prefix: str
    key_hash: str
    expires_at: datetime | None
    # its secret before its last rotation, accepted until then (the agents' clocks say)
    previous_hash: str | None = None
    previous_expires_at: datetime | None = None


class KeyState(Frozen):
    """One signing key of a region or of the control plane (services/sealing/signing.py): its
    id, public half (base64) and state; the seed only where it was opened to be sent (the
    push hub, for the key that signs), never read from the database in clear."""

    kid: str
    public_key: str
    state: str  # published | signing | retiring
    seed: str | None = Field(default=None, repr=False)  # base64


class Slot(Frozen):
    """Where an engine was placed. Kept while it still fits, so that engines do not move (and
    restart) when something unrelated changes."""

    node: str
    gpu_indexes: list[int]
    port: int


class FleetState(Frozen):
    """Every object that shapes a snapshot, by name, as of one revision."""

    revision: int
    clouds: dict[str, CloudSpec] = Field(default_factory=dict)
    regions: dict[str, RegionSpec] = Field(default_factory=dict)
    node_pools: dict[str, NodePoolSpec] = Field(default_factory=dict)
    nodes: dict[str, NodeSpec] = Field(default_factory=dict)
    models: dict[str, ModelSpec] = Field(default_factory=dict)
    deployments: dict[str, DeploymentSpec] = Field(default_factory=dict)
    routing_policies: dict[str, RoutingPolicySpec] = Field(default_factory=dict)
    fallback_rules: dict[str, FallbackRuleSpec] = Field(default_factory=dict)
    tiered_routes: dict[str, TieredRouteSpec] = Field(default_factory=dict)
    tenants: dict[str, TenantSpec] = Field(default_factory=dict)
    adapters: dict[str, AdapterSpec] = Field(default_factory=dict)
    api_keys: dict[str, ApiKeyState] = Field(default_factory=dict)
    # Each region's signing keys (and the control plane's, under CONTROL_PLANE), oldest first.
    signing_keys: dict[str, list[KeyState]] = Field(default_factory=dict, repr=False)
    slots: dict[str, Slot] = Field(default_factory=dict)  # by engine id
    # The capacity planner's engines per deployment with `autoscale` (a fact: it reaches
    # every target at once); a deployment not named runs its `replicas`.
    planned: dict[str, int] = Field(default_factory=dict)
    # The leader's plan of where adapters stay loaded (a fact): adapter to region to engines.
    resident: dict[str, dict[str, int]] = Field(default_factory=dict)
    rollout_policies: dict[str, RolloutPolicySpec] = Field(default_factory=dict)


class RegionInfo(Frozen):
    name: str
    cloud: str
    geography: str
    jurisdiction: str
    state: RegionState
    gateway_url: str | None


class ModelInfo(Frozen):
    name: str
    source: str
    context_length: int
    capabilities: list[str]
    pricing: dict[str, Any] | None = None  # prices.wire's form of its Pricing


class DeploymentInfo(Frozen):
    name: str
    model: str
    backend: EngineBackend
    tp_size: int
    dp_size: int
    pd_mode: PdMode
    engine_args: dict[str, Any]
    drain_timeout_s: float


class Engine(Frozen):
    """One engine process a node must run."""

    id: str
    deployment: str
    model: str
    backend: EngineBackend
    role: str  # unified | prefill | decode
    gpu_indexes: list[int]
    port: int
    url: str
    bootstrap_port: int | None = None  # prefill engines: the PD bootstrap port
    kv_events_port: int | None = None  # engines that publish KV-cache events


class NodePlan(Frozen):
    name: str
    hostname: str
    gpus: list[Gpu]
    engines: list[Engine]


class Unplaced(Frozen):
    deployment: str
    role: str
    count: int
    reason: str


class Worker(Frozen):
    """An endpoint the region's router may send requests to."""

    id: str
    model: str
    deployment: str
    role: str
    url: str
    node: str | None
    bootstrap_port: int | None = None
    kv_events_port: int | None = None
    hardware: str = ""  # its GPUs' model, as its node declares them; "" for external ones


class Route(Frozen):
    model: str
    policy: str
    params: dict[str, Any]
    slo_ttft_ms: int | None
    slo_itl_ms: int | None
    max_inflight: int | None
    max_queue: int | None
    source: str | None  # the routing policy it came from; None: the default
    # where its deployment here may scale to zero: how long a request waits for an engine
    wake_wait_s: int | None = None
    classes: dict[str, Any] | None = None  # its service classes' rules given (the rest: defaults)


class Peer(Frozen):
    region: str
    cloud: str
    jurisdiction: str
    gateway_url: str | None
    models: list[str]  # those it has deployments of


class SigningKey(Frozen):
    key_id: str
    private_key: str = Field(repr=False)  # Ed25519 seed, base64


class TrustedRegion(Frozen):
    """A region whose fallback rules name this one, and the keys its escalations carry."""

    region: str
    jurisdiction: str
    public_keys: dict[str, str]  # Ed25519 raw public keys, base64, by key id


class FallbackChain(Frozen):
    rule: str
    model: str | None
    tenant_tier: str | None
    triggers: list[FallbackTrigger]
    thresholds: FallbackThresholds
    peers: list[Peer]
    classes: list[str] = Field(default_factory=lambda: ["interactive", "standard"])


class TierTable(Frozen):
    bias: float
    weights: dict[str, float]
    thresholds: list[float]


class TierExternal(Frozen):
    url: str
    budget_ms: int


class TierCascade(Frozen):
    signals: list[str]
    min_mean_logprob: float
    buffer_streams: bool


class AdapterInfo(Frozen):
    """A LoRA adapter of a model the region serves, naming the tenants that may use it
    there (those whose jurisdictions allow the region)."""

    name: str
    base_model: str
    source: str
    digest: str  # empty: none given
    rank: int
    resident_engines: int = 0  # engines of the region that keep it loaded, as planned
    tenants: list[str]


class TieredRoute(Frozen):
    """A virtual model, as the region serves it: its tiers the region has deployments of,
    cheapest first."""

    name: str
    tiers: list[str]
    classifier: TierTable | None
    external: TierExternal | None
    cascade: TierCascade | None
    capacity_moves: bool
    conversation_ttl_s: int


class KeyGrant(Frozen):
    prefix: str
    key_hash: str
    expires_at: datetime | None


class TenantGrant(Frozen):
    name: str
    tier: str
    allowed_jurisdictions: list[str] | None
    requests_per_minute: int | None
    tokens_per_minute: int | None
    api_keys: list[KeyGrant]
    debug_routes: bool = False
    disabled: bool = False
    requests_per_minute_share: float | None = None
    tokens_per_minute_share: float | None = None
    quota_requests_per_minute: int | None = None  # the global quotas, which leases share
    quota_tokens_per_minute: int | None = None
    tiering: bool = False  # its requests to tiered routes may go to a cheaper tier
    tier_floor: str | None = None  # a model below which they never go
    max_concurrency: int | None = None  # requests under way at once, fleet-wide (leased)
    max_concurrency_share: float | None = None  # the region's exact share of it
    weight: float = 1.0  # in fair admission
    default_class: str = "standard"  # its requests' service class when they name none
    class_ceiling: str = "standard"  # the highest they may name
    price_discount_percent: float = 0.0  # off its usage's price
    budgets: list[dict[str, Any]] = []  # budgets.wire's form of its budgets
    spend_share: float = 0.0  # the region's part of its budgets, 0 to 1 (static shares)


class RegionSnapshot(Frozen):
    revision: int
    region: RegionInfo
    models: list[ModelInfo]
    deployments: list[DeploymentInfo]
    nodes: list[NodePlan]
    unplaced: list[Unplaced]
    workers: list[Worker]
    routes: list[Route]
    fallback: list[FallbackChain]
    tenants: list[TenantGrant]
    signing_key: SigningKey | None = None
    trusted: list[TrustedRegion] = Field(default_factory=list)
    tiered: list[TieredRoute] = Field(default_factory=list)
    adapters: list[AdapterInfo] = Field(default_factory=list)
