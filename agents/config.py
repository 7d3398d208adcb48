"""A snapshot compiled, when it is applied, into the immutable config the gateway reads.

Everything a request needs is here, checked once: routes with their policy parameters
validated, API keys by hash, each tenant's share of its quota on this node, fallback chains.
A policy whose parameters do not validate raises SnapshotInvalid, so the snapshot is nacked on
arrival and never found wanting at request time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from google.protobuf import json_format
from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.budgets import BudgetRule
from meridian_pb.fleet.v1.budgets import rules as budget_rules
from meridian_pb.fleet.v1.classes import (
    DEFAULT_ESCALATE,
    DEFAULT_POLICY,
    ClassPolicy,
    ServiceClass,
    policy_for,
)
from meridian_pb.fleet.v1.features import FEATURES, Table, default_table
from meridian_pb.fleet.v1.params import PolicyParams, params_for
from meridian_pb.fleet.v1.prices import PriceList
from pydantic import ValidationError

from agents.adapter_config import AdapterConfig, compile_adapters
from agents.errors import SnapshotInvalid
from agents.signing import Sender, Signer, sender_of, signer_of


@dataclass(frozen=True)
class ModelConfig:
    name: str
    context_length: int
    capabilities: frozenset[str]
    source: str = ""  # the weights' path or repository (a new one makes new canaries)
    prices: PriceList | None = None  # what its usage costs; None: unpriced


@dataclass(frozen=True)
class WorkerSpec:
    """An endpoint of the region that the router may send requests to."""

    id: str
    model: str
    deployment: str
    role: str  # unified | prefill | decode
    url: str
    node: str | None
    bootstrap_port: int | None = None
    kv_events_port: int | None = None
    hardware: str = ""  # its GPUs' model ("" when not known)

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or "127.0.0.1"


@dataclass(frozen=True)
class RouteConfig:
    model: str
    policy: str
    params: PolicyParams
    slo_ttft_s: float | None
    slo_itl_s: float | None
    max_inflight: int | None  # per worker, from this gateway
    max_queue: int  # requests waiting for admission, per model
    wake_wait_s: float | None = None  # it may have no engine here: the wait for one to start
    classes: ClassPolicy = DEFAULT_POLICY  # how its service classes are admitted

    @property
    def key(self) -> tuple[str, str, str]:
        """Policy instances live on across snapshots while this stays the same."""
        return (self.model, self.policy, self.params.model_dump_json())


@dataclass(frozen=True)
class Tenant:
    name: str
    tier: str
    jurisdictions: frozenset[str] | None  # None: any
    requests_per_minute: float | None  # this node's share
    tokens_per_minute: float | None
    debug_routes: bool = False  # may see how its requests were routed
    disabled: bool = False  # its keys are refused
    quota_requests_per_minute: int | None = None  # the global quotas, which leases share
    quota_tokens_per_minute: int | None = None
    tiering: bool = False  # its tiered requests may go to a cheaper tier
    tier_floor: str | None = None  # a model below which they never go
    max_concurrency: float | None = None  # this node's share of its limit of requests at once
    quota_concurrency: int | None = None  # the global limit, which leases share
    weight: float = 1.0  # in fair admission
    default_class: ServiceClass = ServiceClass.STANDARD  # of its requests that name none
    class_ceiling: ServiceClass = ServiceClass.STANDARD  # the highest they may name
    discount: float = 0.0  # off its usage's price, a fraction
    budgets: tuple[BudgetRule, ...] = ()  # its spend budgets (agents/gateway/budgets.py)


@dataclass(frozen=True)
class Cascade:
    signals: frozenset[str]  # invalid_json | tool_schema | length | low_logprob
    min_mean_logprob: float
    buffer_streams: bool


@dataclass(frozen=True)
class TieredRouteConfig:
    """A virtual model: its tiers (real models served here, cheapest first) and how one is
    chosen (agents/gateway/tiers.py)."""

    name: str
    tiers: tuple[str, ...]
    table: Table
    external_url: str | None = None
    external_budget_s: float = 0.02
    cascade: Cascade | None = None
    capacity_moves: bool = True
    conversation_ttl_s: float = 1800.0


@dataclass(frozen=True)
class ApiKey:
    tenant: Tenant
    prefix: str
    expires_at: float | None  # unix seconds


@dataclass(frozen=True)
class Peer:
    region: str
    jurisdiction: str
    gateway_url: str | None
    models: frozenset[str]


@dataclass(frozen=True)
class FallbackChain:
    rule: str
    model: str | None
    tenant_tier: str | None
    triggers: frozenset[str]  # overload | failure
    peers: tuple[Peer, ...]  # in order of preference
    ttft_s: float | None = None  # overload: the predicted local TTFT past which it escalates
    queue_depth: int | None = None  # overload: requests waiting past which it escalates
    error_rate: float | None = None  # failure: the share of failed local attempts
    classes: frozenset[ServiceClass] = frozenset(DEFAULT_ESCALATE)  # the classes it escalates

    def applies(self, model: str, tier: str, service_class: ServiceClass) -> bool:
        return (
            self.model in (None, model)
            and self.tenant_tier in (None, tier)
            and service_class in self.classes
        )


@dataclass(frozen=True)
class RegionConfig:
    revision: int
    digest: str
    region: str
    cloud: str
    jurisdiction: str
    models: Mapping[str, ModelConfig] = field(default_factory=dict)
    routes: Mapping[str, RouteConfig] = field(default_factory=dict)
    workers: tuple[WorkerSpec, ...] = ()
    keys: Mapping[str, ApiKey] = field(default_factory=dict)  # by SHA-256 hex of the key
    fallback: tuple[FallbackChain, ...] = ()
    tenants: Mapping[str, Tenant] = field(default_factory=dict)
    signer: Signer | None = None
    senders: Mapping[str, Sender] = field(default_factory=dict)
    tiered: Mapping[str, TieredRouteConfig] = field(default_factory=dict)
    adapters: Mapping[str, AdapterConfig] = field(default_factory=dict)

    def chain(self, model: str, tier: str, service_class: ServiceClass) -> FallbackChain | None:
        """The most specific rule for the model, the tenant's tier and the request's class
        (compiled first); None: it does not escalate."""
        return next((c for c in self.fallback if c.applies(model, tier, service_class)), None)

    def workers_of(self, model: str) -> list[WorkerSpec]:
        return [w for w in self.workers if w.model == model]


DEFAULT_MAX_QUEUE = 256


def compile_config(snapshot: pb.Snapshot) -> RegionConfig:
    """Raises SnapshotInvalid for a policy or parameter the router does not have."""
    models = {m.name: _model(m) for m in snapshot.models}
    routes = {r.model: _route(r) for r in snapshot.routes}
    # the region's share is split over its nodes, up or not: their shares never sum above it
    nodes = max(1, snapshot.node_count or len(snapshot.nodes))
    keys: dict[str, ApiKey] = {}
    tenants: dict[str, Tenant] = {}
    for grant in snapshot.tenants:
        tenant = Tenant(
            name=grant.name,
            tier=grant.tier,
            jurisdictions=(
                frozenset(grant.allowed_jurisdictions.names)
                if grant.HasField("allowed_jurisdictions")
                else None
            ),
            requests_per_minute=_node_share(grant, "requests_per_minute", nodes),
            tokens_per_minute=_node_share(grant, "tokens_per_minute", nodes),
            debug_routes=grant.debug_routes,
            disabled=grant.disabled,
            quota_requests_per_minute=_optional(grant, "quota_requests_per_minute"),
            quota_tokens_per_minute=_optional(grant, "quota_tokens_per_minute"),
            tiering=grant.tiering,
            tier_floor=grant.tier_floor if grant.HasField("tier_floor") else None,
            max_concurrency=_node_share(grant, "max_concurrency", nodes),
            quota_concurrency=_optional(grant, "max_concurrency"),
            weight=grant.weight or 1.0,
            default_class=_class(grant.default_class, grant.name),
            class_ceiling=_class(grant.class_ceiling, grant.name),
            discount=min(1.0, max(0.0, grant.price_discount_percent / 100)),
            budgets=budget_rules(grant, nodes),
        )
        tenants[tenant.name] = tenant
        for key in grant.api_keys:
            expires = key.expires_at.ToSeconds() if key.HasField("expires_at") else None
            keys[key.key_hash] = ApiKey(tenant, key.prefix, float(expires) if expires else None)
    workers = tuple(
        WorkerSpec(
            id=w.id,
            model=w.model,
            deployment=w.deployment,
            role=w.role or "unified",
            url=w.url.rstrip("/"),
            node=w.node if w.HasField("node") else None,
            bootstrap_port=w.bootstrap_port if w.HasField("bootstrap_port") else None,
            kv_events_port=w.kv_events_port if w.HasField("kv_events_port") else None,
            hardware=w.hardware,
        )
        for w in snapshot.workers
    )
    for worker in workers:
        if worker.role == "prefill" and worker.bootstrap_port is None:
            raise SnapshotInvalid(f"prefill worker {worker.id} has no bootstrap port")
    return RegionConfig(
        revision=snapshot.revision,
        digest=snapshot.digest,
        region=snapshot.region.name,
        cloud=snapshot.region.cloud,
        jurisdiction=snapshot.region.jurisdiction,
        models=MappingProxyType(models),
        routes=MappingProxyType(routes),
        workers=workers,
        keys=MappingProxyType(keys),
        fallback=tuple(_chain(c) for c in snapshot.fallback),
        tenants=MappingProxyType(tenants),
        signer=signer_of(snapshot),
        senders=MappingProxyType({t.region: sender_of(t) for t in snapshot.trusted}),
        tiered=MappingProxyType({t.name: _tiered(t, models) for t in snapshot.tiered}),
        adapters=MappingProxyType(compile_adapters(snapshot, models)),
    )


def _optional(message: Any, name: str) -> Any:
    return getattr(message, name) if message.HasField(name) else None


def _model(m: pb.ModelInfo) -> ModelConfig:
    prices = None
    if m.HasField("pricing"):
        listed = [(p.from_s, p.input_micros, p.cached_input_micros, p.output_micros)
                  for p in m.pricing.prices]  # fmt: skip
        if listed != sorted(listed) or any(v < 0 for p in listed for v in p[1:]):
            raise SnapshotInvalid(f"model {m.name}: its prices must be in order, none below 0")
        prices = PriceList(listed, dict(m.pricing.class_multipliers))
    return ModelConfig(m.name, m.context_length, frozenset(m.capabilities), m.source, prices)


def _tiered(route: pb.TieredRoute, models: Mapping[str, ModelConfig]) -> TieredRouteConfig:
    tiers = tuple(route.tiers)
    if not tiers or route.name in models or any(t not in models for t in tiers):
        raise SnapshotInvalid(f"tiered route {route.name}: its tiers must be models served here")
    if route.HasField("classifier"):
        given = route.classifier
        unknown = set(given.weights) - set(FEATURES)
        if unknown or len(given.thresholds) != len(tiers) - 1:
            raise SnapshotInvalid(
                f"tiered route {route.name}: a table of {len(given.thresholds)} thresholds "
                f"for {len(tiers)} tiers, or unknown features {sorted(unknown)}"
            )
        table = Table(given.bias, MappingProxyType(dict(given.weights)), tuple(given.thresholds))
    else:
        table = default_table(len(tiers))
    cascade = None
    if route.HasField("cascade"):
        c = route.cascade
        cascade = Cascade(frozenset(c.signals), c.min_mean_logprob, c.buffer_streams)
    external = route.external if route.HasField("external") else None
    return TieredRouteConfig(
        name=route.name,
        tiers=tiers,
        table=table,
        external_url=external.url.rstrip("/") if external is not None else None,
        external_budget_s=external.budget_ms / 1000 if external is not None else 0.02,
        cascade=cascade,
        capacity_moves=route.capacity_moves,
        conversation_ttl_s=float(route.conversation_ttl_s),
    )


def _chain(chain: pb.FallbackChain) -> FallbackChain:
    limits = chain.thresholds
    return FallbackChain(
        rule=chain.rule,
        model=chain.model if chain.HasField("model") else None,
        tenant_tier=chain.tenant_tier if chain.HasField("tenant_tier") else None,
        triggers=frozenset(chain.triggers),
        peers=tuple(
            Peer(
                region=p.region,
                jurisdiction=p.jurisdiction,
                gateway_url=p.gateway_url.rstrip("/") if p.HasField("gateway_url") else None,
                models=frozenset(p.models),
            )
            for p in chain.peers
        ),
        ttft_s=limits.ttft_ms / 1000 if limits.HasField("ttft_ms") else None,
        queue_depth=limits.queue_depth if limits.HasField("queue_depth") else None,
        error_rate=limits.error_rate if limits.HasField("error_rate") else None,
        classes=(
            frozenset(_class(c, chain.rule) for c in chain.classes)
            if chain.classes
            else frozenset(DEFAULT_ESCALATE)
        ),
    )


def _class(name: str, where: str) -> ServiceClass:
    """A service class by name ("": standard)."""
    try:
        return ServiceClass.named(name) if name else ServiceClass.STANDARD
    except ValueError as error:
        raise SnapshotInvalid(f"{where}: {error}") from None


def _route(route: pb.Route) -> RouteConfig:
    raw: dict[str, Any] = (
        json_format.MessageToDict(route.params) if route.HasField("params") else {}
    )
    try:
        params = params_for(route.policy, raw)
    except KeyError:
        raise SnapshotInvalid(
            f"model {route.model}: no routing policy named {route.policy!r}"
        ) from None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "params"
        raise SnapshotInvalid(
            f"model {route.model}: policy {route.policy} params.{where}: {first['msg']}"
        ) from None
    return RouteConfig(
        model=route.model,
        policy=route.policy,
        params=params,
        slo_ttft_s=route.slo_ttft_ms / 1000 if route.HasField("slo_ttft_ms") else None,
        slo_itl_s=route.slo_itl_ms / 1000 if route.HasField("slo_itl_ms") else None,
        max_inflight=route.max_inflight if route.HasField("max_inflight") else None,
        max_queue=route.max_queue if route.HasField("max_queue") else DEFAULT_MAX_QUEUE,
        wake_wait_s=route.wake_wait_s if route.HasField("wake_wait_s") else None,
        classes=_classes(route),
    )


def _classes(route: pb.Route) -> ClassPolicy:
    if not route.HasField("classes"):
        return DEFAULT_POLICY
    try:
        return policy_for(json_format.MessageToDict(route.classes))
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "classes"
        raise SnapshotInvalid(f"model {route.model}: classes.{where}: {first['msg']}") from None


def _node_share(grant: pb.TenantGrant, name: str, nodes: int) -> float | None:
    """The region's share of a tenant's quota (exact where the control plane says it, else
    whole), split over the region's nodes: their shares sum to the region's, never above
    (a node down leaves its part unused until the leases, which follow demand, take it)."""
    exact = f"{name}_share"
    if grant.HasField(exact):  # type: ignore[arg-type]
        share: float = getattr(grant, exact)
        return share / nodes
    if not grant.HasField(name):  # type: ignore[arg-type]
        return None
    value: int = getattr(grant, name)
    return value / nodes
