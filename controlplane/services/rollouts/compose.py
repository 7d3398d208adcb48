"""What a target is compiled from: the newest facts with the intent it holds. No I/O.

The fleet's objects are of two sorts.

- **Intent** (models, deployments, routing policies, fallback rules, tiered routes, adapters)
  is what an operator changes to change how requests are served. A change to it rolls out in
  waves: each target holds the intent of some revision until its wave comes, and a rollback
  gives it back the last good one. An adapter's tenants are the exception within it: one
  taken out of an adapter loses it everywhere at once (what an older intent grants is cut
  to what the newest still grants), as a revoked key does; one added waits for its wave.
- **Facts** (clouds, regions, nodes, tenants, API keys, signing keys, placement) say what
  exists and who may call. They reach every target at once: a revoked key, a disabled tenant
  or a node that went down must not wait for a bake time, and a quota change concerns only
  its tenant (whose own 429s no check counts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controlplane.schemas.adapters import AdapterSpec
from controlplane.schemas.fleet import (
    DeploymentSpec,
    FallbackRuleSpec,
    ModelSpec,
    RoutingPolicySpec,
    TieredRouteSpec,
)
from controlplane.snapshot.types import FleetState

INTENT_KEYS = ("models", "deployments", "routing_policies", "fallback_rules", "tiered_routes",
               "adapters")  # fmt: skip
# the kinds (as the audit names them) whose changes roll out
INTENT_KINDS = frozenset({"model", "deployment", "routing-policy", "fallback-rule", "tiered-route",
                          "adapter"})  # fmt: skip


@dataclass(frozen=True)
class Intent:
    revision: int
    models: dict[str, ModelSpec]
    deployments: dict[str, DeploymentSpec]
    routing_policies: dict[str, RoutingPolicySpec]
    fallback_rules: dict[str, FallbackRuleSpec]
    tiered_routes: dict[str, TieredRouteSpec] = field(default_factory=dict)
    adapters: dict[str, AdapterSpec] = field(default_factory=dict)

    @classmethod
    def parse(cls, revision: int, doc: dict[str, Any]) -> Intent:
        return cls(
            revision,
            {n: ModelSpec.model_validate(v) for n, v in doc.get("models", {}).items()},
            {n: DeploymentSpec.model_validate(v) for n, v in doc.get("deployments", {}).items()},
            {n: RoutingPolicySpec.model_validate(v)
             for n, v in doc.get("routing_policies", {}).items()},
            {n: FallbackRuleSpec.model_validate(v)
             for n, v in doc.get("fallback_rules", {}).items()},
            {n: TieredRouteSpec.model_validate(v)
             for n, v in doc.get("tiered_routes", {}).items()},
            {n: AdapterSpec.model_validate(v) for n, v in doc.get("adapters", {}).items()},
        )  # fmt: skip


def intent_doc(state: FleetState) -> dict[str, Any]:
    """The intent part of a fleet, JSON-ready, as it is stored per revision."""
    return {
        key: {name: spec.model_dump(mode="json") for name, spec in getattr(state, key).items()}
        for key in INTENT_KEYS
    }


def compose(state: FleetState, intent: Intent) -> FleetState:
    """The newest facts with an older intent. What the intent names that no longer exists (a
    region deleted since) is left out, so that an old intent always compiles."""
    regions, models = state.regions, intent.models
    rules = {
        name: rule.model_copy(update={"peers": [p for p in rule.peers if p in regions]})
        for name, rule in intent.fallback_rules.items()
        if rule.region in regions
    }
    return state.model_copy(
        update={
            "models": models,
            "deployments": {
                n: d
                for n, d in intent.deployments.items()
                if d.region in regions and d.model in models
            },
            "routing_policies": {
                n: p
                for n, p in intent.routing_policies.items()
                if p.model in models and (p.region is None or p.region in regions)
            },
            "fallback_rules": rules,
            "tiered_routes": intent.tiered_routes,
            "adapters": _granted(intent.adapters, state.adapters, models),
        }
    )


def _granted(
    held: dict[str, AdapterSpec], newest: dict[str, AdapterSpec], models: dict[str, Any]
) -> dict[str, AdapterSpec]:
    """An older intent's adapters of its models, each with only the tenants the newest
    state still grants it (taken out: at once; added: in its wave)."""
    out = {}
    for name, adapter in held.items():
        if adapter.base_model not in models:
            continue
        now = newest.get(name)
        if now is not None:
            kept = [t for t in adapter.tenants if t in now.tenants]
            adapter = adapter.model_copy(update={"tenants": kept})
        out[name] = adapter
    return out


@dataclass
class Holdings:
    """Which intent revision each target holds; None: the newest."""

    regions: dict[str, int] = field(default_factory=dict)
    nodes: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, rows: list[tuple[str, int]]) -> Holdings:
        held = cls()
        for target, revision in rows:
            sort, _, name = target.partition(":")
            (held.nodes if sort == "node" else held.regions)[name] = revision
        return held

    def of_node(self, node: str, region: str) -> int | None:
        return self.nodes.get(node, self.regions.get(region))

    def in_region(self, state: FleetState, region: str) -> set[int | None]:
        """The intents held by some target of the region."""
        held = {self.regions.get(region)}
        held |= {
            r for n, r in self.nodes.items() if n in state.nodes and state.nodes[n].region == region
        }
        return held
