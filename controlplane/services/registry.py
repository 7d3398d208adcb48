"""Every kind, by URL segment, with the dependencies that guard deletes."""

from __future__ import annotations

from typing import Any

from controlplane.services.access_kinds import API_KEY, BOOTSTRAP_TOKEN, PRINCIPAL, TENANT
from controlplane.services.adapter_kind import ADAPTER
from controlplane.services.fleet_kinds import (
    CLOUD,
    DEPLOYMENT,
    FALLBACK,
    MODEL,
    NODE,
    NODE_POOL,
    REGION,
    ROUTING_POLICY,
    TIERED_ROUTE,
)
from controlplane.services.kind import Kind
from controlplane.services.rollouts.kind import ROLLOUT_POLICY_KIND

CLOUD.dependents_of = [(REGION, "cloud_id"), (NODE_POOL, "cloud_id")]
NODE_POOL.dependents_of = [(NODE, "pool_id")]
REGION.dependents_of = [
    (NODE_POOL, "region_id"),
    (DEPLOYMENT, "region_id"),
    (ROUTING_POLICY, "region_id"),
    (FALLBACK, "region_id"),
    (NODE, "region_id"),
    (BOOTSTRAP_TOKEN, "region_id"),
]
MODEL.dependents_of = [
    (DEPLOYMENT, "model_id"),
    (ROUTING_POLICY, "model_id"),
    (FALLBACK, "model_id"),
    (ADAPTER, "base_model_id"),
]
TENANT.dependents_of = [(API_KEY, "tenant_id"), (PRINCIPAL, "tenant_id")]

# In dependency order: a kind refers only to kinds before it.
KINDS: list[Kind[Any]] = [
    CLOUD,
    REGION,
    NODE_POOL,
    NODE,
    MODEL,
    DEPLOYMENT,
    ROUTING_POLICY,
    FALLBACK,
    TIERED_ROUTE,
    TENANT,
    ADAPTER,
    API_KEY,
    PRINCIPAL,
    BOOTSTRAP_TOKEN,
    ROLLOUT_POLICY_KIND,
]
BY_PLURAL: dict[str, Kind[Any]] = {kind.plural: kind for kind in KINDS}

# Document keys, in dependency order: a kind refers only to kinds before it.
APPLY_KINDS: dict[str, Kind[Any]] = {
    "clouds": CLOUD,
    "regions": REGION,
    "node_pools": NODE_POOL,
    "nodes": NODE,
    "models": MODEL,
    "deployments": DEPLOYMENT,
    "routing_policies": ROUTING_POLICY,
    "fallback_rules": FALLBACK,
    "tiered_routes": TIERED_ROUTE,
    "tenants": TENANT,
    "adapters": ADAPTER,
    "rollout_policies": ROLLOUT_POLICY_KIND,
}
