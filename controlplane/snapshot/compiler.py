"""compile_region: the fleet at a revision in, one region's desired state out. No I/O."""

from __future__ import annotations

from typing import Any, NamedTuple
from urllib.parse import urlsplit

from meridian_pb.fleet.v1.assertion import CONTROL_PLANE
from meridian_pb.fleet.v1.budgets import wire as budget_wire
from meridian_pb.fleet.v1.prices import wire

from controlplane.domain import EngineBackend, RegionState
from controlplane.schemas.fleet import FallbackRuleSpec
from controlplane.snapshot.index import FleetIndex
from controlplane.snapshot.keys import SIGNING
from controlplane.snapshot.placement import KV_EVENTS_PORT_OFFSET, place
from controlplane.snapshot.shares import exact_share, region_part, serving_weights, whole_share
from controlplane.snapshot.types import (
    AdapterInfo,
    DeploymentInfo,
    FallbackChain,
    FleetState,
    ModelInfo,
    NodePlan,
    Peer,
    RegionInfo,
    RegionSnapshot,
    Route,
    SigningKey,
    TenantGrant,
    TierCascade,
    TieredRoute,
    TierExternal,
    TierTable,
    TrustedRegion,
    Unplaced,
    Worker,
)


class Placed(NamedTuple):
    """A region's engines on its nodes, what did not fit, and the workers its router sees."""

    nodes: list[NodePlan]
    unplaced: list[Unplaced]
    workers: list[Worker]


def compile_region(
    state: FleetState, region: str, index: FleetIndex | None = None
) -> RegionSnapshot:
    index = index or FleetIndex.of(state)
    routes = region_routes(state, region, index)
    placed = placement(state, region, kv_event_models(routes))
    return RegionSnapshot(
        nodes=placed.nodes,
        unplaced=placed.unplaced,
        workers=placed.workers,
        tenants=tenant_grants(state, region, index),
        **region_catalog(state, region, index, routes),
    )


def region_routes(state: FleetState, region: str, index: FleetIndex) -> list[Route]:
    waking = {d.model: d.autoscale.wake_wait_s for d in index.deployments[region].values()
              if d.autoscale is not None and d.autoscale.scale_to_zero}  # fmt: skip
    models = sorted({d.model for d in index.deployments[region].values()})
    return [_route(state, region, m).model_copy(update={"wake_wait_s": waking.get(m)})
            for m in models]  # fmt: skip


def kv_event_models(routes: list[Route]) -> frozenset[str]:
    return frozenset(r.model for r in routes if r.params.get("kv_events") is True)


def placement(state: FleetState, region: str, events: frozenset[str]) -> Placed:
    """Reads the region's spec and nodes, its deployments, their models and the planner's
    engine counts for them, and the slots on its nodes: nothing else of `state` (see
    push/parts.py, which relies on it)."""
    if state.regions[region].state is RegionState.DISABLED:
        return Placed([], [], [])
    nodes, unplaced = place(state, region)
    nodes = _with_kv_events(nodes, events)
    return Placed(nodes, unplaced, _workers(state, region, nodes, events))


def region_catalog(
    state: FleetState, region: str, index: FleetIndex, routes: list[Route]
) -> dict[str, Any]:
    """The rest of the region's snapshot: small, and cheap to compile every time."""
    spec = state.regions[region]
    deployments = index.deployments[region]
    models = [r.model for r in routes]
    return {
        "revision": state.revision,
        "region": RegionInfo(name=region, **spec.model_dump(exclude={"utc_offset_h"})),
        "models": [
            ModelInfo(
                name=m,
                **state.models[m].model_dump(include={"source", "context_length", "capabilities"}),
                pricing=wire(pricing) if (pricing := state.models[m].pricing) else None,
            )
            for m in models
        ],
        "deployments": [
            DeploymentInfo(
                name=n,
                **d.model_dump(
                    include={
                        "model",
                        "backend",
                        "tp_size",
                        "dp_size",
                        "pd_mode",
                        "engine_args",
                        "drain_timeout_s",
                    }
                ),
            )
            for n, d in deployments.items()
        ],
        "routes": routes,
        "fallback": _fallback(state, region, index),
        "signing_key": _signing_key(state, region),
        "trusted": _trusted(state, region),
        "tiered": _tiered(state, set(models)),
        "adapters": _adapters(state, region, set(models)),
    }


def _workers(
    state: FleetState, region: str, nodes: list[NodePlan], events: frozenset[str]
) -> list[Worker]:
    workers = [
        Worker(
            id=e.id,
            model=e.model,
            deployment=e.deployment,
            role=e.role,
            url=e.url,
            node=node.name,
            bootstrap_port=e.bootstrap_port,
            kv_events_port=e.kv_events_port,
            hardware=",".join(sorted({g.model for g in node.gpus if g.index in e.gpu_indexes})),
        )
        for node in nodes
        for e in node.engines
    ]
    for name, d in sorted(state.deployments.items()):
        if d.region == region and d.backend is EngineBackend.EXTERNAL:
            workers += [
                Worker(
                    id=f"{name}/external-{i}",
                    model=d.model,
                    deployment=name,
                    role="unified",
                    url=url,
                    node=None,
                    # external engines publish where managed ones do: their port + 2000
                    kv_events_port=_events_port(url) if d.model in events else None,
                )
                for i, url in enumerate(d.external_urls)
            ]
    return sorted(workers, key=lambda w: w.id)


def _events_port(url: str) -> int | None:
    parts = urlsplit(url)
    port = (parts.port or (443 if parts.scheme == "https" else 80)) + KV_EVENTS_PORT_OFFSET
    return port if port <= 65535 else None


def _with_kv_events(nodes: list[NodePlan], models: frozenset[str]) -> list[NodePlan]:
    """Engines of a model whose route sets `kv_events: true` publish their cache events on
    their port + 2000; routers subscribe there."""
    return [
        n.model_copy(
            update={
                "engines": [
                    e.model_copy(update={"kv_events_port": e.port + KV_EVENTS_PORT_OFFSET})
                    if e.model in models
                    else e
                    for e in n.engines
                ]
            }
        )
        for n in nodes
    ]


def _route(state: FleetState, region: str, model: str) -> Route:
    """The region's own policy for the model, else the model's, else the default."""
    candidates = sorted(
        (p.region is None, name, p)
        for name, p in state.routing_policies.items()
        if p.model == model and p.region in (region, None)
    )
    if not candidates:
        return Route(
            model=model,
            policy="cost",
            params={},
            slo_ttft_ms=None,
            slo_itl_ms=None,
            max_inflight=None,
            max_queue=None,
            source=None,
        )
    _, name, policy = candidates[0]
    classes = policy.classes.model_dump(exclude_none=True) if policy.classes else None
    return Route(source=name, classes=classes, **policy.model_dump(exclude={"region", "classes"}))


def _adapters(state: FleetState, region: str, models: set[str]) -> list[AdapterInfo]:
    """The adapters of the models the region serves, each naming the tenants that may use
    it here: those that exist and whose jurisdictions allow the region. An adapter no such
    tenant may use never reaches the region (a bound tenant's adapter stays within its
    jurisdictions)."""
    jurisdiction = state.regions[region].jurisdiction
    out = []
    for name, adapter in sorted(state.adapters.items()):
        if adapter.base_model not in models:
            continue
        tenants = [
            t for t in adapter.tenants
            if (tenant := state.tenants.get(t)) is not None
            and (tenant.allowed_jurisdictions is None
                 or jurisdiction in tenant.allowed_jurisdictions)
        ]  # fmt: skip
        if tenants:
            out.append(AdapterInfo(name=name, base_model=adapter.base_model, source=adapter.source,
                                   digest=adapter.digest or "", rank=adapter.rank,
                                   tenants=tenants,
                                   resident_engines=state.resident.get(name, {}).get(region, 0),
                                   ))  # fmt: skip
    return out


def _tiered(state: FleetState, models: set[str]) -> list[TieredRoute]:
    """The tiered routes with a tier here, each with the tiers the region serves. Where a
    tier is missing, the table's threshold between it and the next cheaper is dropped with it
    (requests it would have had go to the next stronger tier)."""
    out = []
    for name, route in sorted(state.tiered_routes.items()):
        if name in models:
            continue  # a model of that name (made while it was compiled) wins
        kept = [i for i, tier in enumerate(route.tiers) if tier in models]
        if not kept:
            continue
        table = None
        if route.classifier is not None and len(kept) > 1:
            cuts = route.classifier.thresholds  # cut i lies between tiers i and i + 1
            table = TierTable(
                bias=route.classifier.bias,
                weights={str(f): w for f, w in sorted(route.classifier.weights.items())},
                thresholds=[cuts[below] for below in kept[:-1]],
            )
        external = route.external_classifier
        cascade = route.cascade
        out.append(
            TieredRoute(
                name=name,
                tiers=[route.tiers[i] for i in kept],
                classifier=table,
                external=(
                    TierExternal(url=str(external.url), budget_ms=external.budget_ms)
                    if external is not None
                    else None
                ),
                cascade=(
                    TierCascade(
                        signals=[str(s) for s in cascade.signals],
                        min_mean_logprob=cascade.min_mean_logprob,
                        buffer_streams=cascade.buffer_streams,
                    )
                    if cascade is not None
                    else None
                ),
                capacity_moves=route.capacity_moves,
                conversation_ttl_s=route.conversation_ttl_s,
            )
        )
    return out


def _fallback(state: FleetState, region: str, index: FleetIndex) -> list[FallbackChain]:
    """Most specific rule first; only active peers, with what an agent needs to reach them."""

    def specificity(item: tuple[str, FallbackRuleSpec]) -> tuple[bool, bool, str]:
        name, rule = item
        return (rule.model is None, rule.tenant_tier is None, name)

    chains = []
    for name, rule in sorted(state.fallback_rules.items(), key=specificity):
        if rule.region != region:
            continue
        peers = [
            Peer(
                region=p,
                cloud=state.regions[p].cloud,
                jurisdiction=state.regions[p].jurisdiction,
                gateway_url=state.regions[p].gateway_url,
                models=sorted({d.model for d in index.deployments[p].values()}),
            )
            for p in rule.peers
            if state.regions[p].state is RegionState.ACTIVE
        ]
        chains.append(
            FallbackChain(
                rule=name,
                model=rule.model,
                tenant_tier=rule.tenant_tier,
                triggers=rule.triggers,
                thresholds=rule.thresholds,
                peers=peers,
                classes=[str(c) for c in rule.classes],
            )
        )
    return chains


def _signing_key(state: FleetState, region: str) -> SigningKey | None:
    """The region's key that signs, where its seed was opened (the push hub opens it)."""
    for key in state.signing_keys.get(region, []):
        if key.state == SIGNING and key.seed is not None:
            return SigningKey(key_id=key.kid, private_key=key.seed)
    return None


def _accepted(state: FleetState, owner: str) -> dict[str, str]:
    """The public halves of every key of `owner` a region accepts: published (about to
    sign), signing, and retiring (until an assertion it signed can no longer be valid)."""
    return {key.kid: key.public_key for key in state.signing_keys.get(owner, [])}


def _trusted(state: FleetState, region: str) -> list[TrustedRegion]:
    """The regions that may escalate to this one (their rules name it as a peer), and the
    control plane, which sends it batches' lines."""
    senders = sorted({r.region for r in state.fallback_rules.values() if region in r.peers})
    trusted = []
    for sender in senders:
        keys = _accepted(state, sender)
        if not keys or sender not in state.regions:
            continue
        jurisdiction = state.regions[sender].jurisdiction
        trusted.append(TrustedRegion(region=sender, jurisdiction=jurisdiction, public_keys=keys))
    ours = _accepted(state, CONTROL_PLANE)
    if ours:  # the control plane, for the batch lines it sends (any jurisdiction)
        trusted.append(TrustedRegion(region=CONTROL_PLANE, jurisdiction="", public_keys=ours))
    return trusted


def tenant_grants(state: FleetState, region: str, index: FleetIndex) -> list[TenantGrant]:
    """Every tenant, with this region's share of its global quotas; a tenant whose
    jurisdictions exclude this region's is listed with no share, so that its keys are known
    here and answered 403 (not 401, as an unknown key is)."""
    jurisdiction = state.regions[region].jurisdiction
    grants = []
    for name, tenant in sorted(state.tenants.items()):
        allowed = tenant.allowed_jurisdictions
        barred = allowed is not None and jurisdiction not in allowed
        weights = {} if barred else serving_weights(state, name, index.weights)
        keys = index.keys.get(name, [])
        grants.append(
            TenantGrant(
                name=name,
                tier=tenant.tier,
                allowed_jurisdictions=allowed,
                requests_per_minute=whole_share(tenant.requests_per_minute, weights, region),
                tokens_per_minute=whole_share(tenant.tokens_per_minute, weights, region),
                requests_per_minute_share=exact_share(tenant.requests_per_minute, weights, region),
                tokens_per_minute_share=exact_share(tenant.tokens_per_minute, weights, region),
                quota_requests_per_minute=tenant.requests_per_minute,
                quota_tokens_per_minute=tenant.tokens_per_minute,
                api_keys=keys,
                debug_routes=tenant.debug_routes,
                disabled=tenant.disabled,
                tiering=tenant.tiering,
                tier_floor=tenant.tier_floor,
                max_concurrency=tenant.max_concurrency,
                max_concurrency_share=exact_share(tenant.max_concurrency, weights, region),
                weight=tenant.weight,
                default_class=str(tenant.default_class),
                class_ceiling=str(tenant.class_ceiling),
                price_discount_percent=tenant.price_discount_percent,
                budgets=[budget_wire(b) for b in tenant.budgets],
                spend_share=region_part(weights, region),
            )
        )
    return grants
