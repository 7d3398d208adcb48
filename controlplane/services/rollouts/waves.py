"""A rollout's waves, from the policy and the fleet as it is when the rollout begins. No I/O.

Only the regions whose snapshot the change alters are targets: a change to one region's
routing policy rolls out to that region alone (its canary node first, when it has several).
The canary region is the policy's, or the affected region with the fewest GPUs (the least
harm if it is wrong); the other regions follow smallest first.

Each wave names the models whose part of its regions' snapshots the change alters (their
model, deployments, engines, workers, route, fallback chains and tiered routes): those are
the models its checks judge. A fleet serves many models and most are idle at any hour; a
change to one must not wait for traffic to the others.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel

from controlplane.domain import NodeState
from controlplane.schemas.rollout import Canary, RolloutPolicySpec
from controlplane.services.rollouts.compose import Intent, compose
from controlplane.snapshot import FleetState, RegionSnapshot, compile_region
from controlplane.snapshot.shares import region_weight

ALL = "*"  # a part of a snapshot that concerns every model


class Wave(BaseModel):
    name: str
    targets: list[str]  # region:<name> or node:<name>
    bake_s: float
    # the models whose desired state it changes (None: a wave planned before they were named)
    models: list[str] | None = None


def affected(state: FleetState, base: Intent | None, new: Intent) -> dict[str, list[str]]:
    """The regions whose snapshot differs between the base intent and the new one, each with
    the models whose part of it differs."""
    old_fleet = state if base is None else compose(state, base)
    new_fleet = compose(state, new)
    out = {}
    for region in sorted(state.regions):
        before = compile_region(old_fleet, region).model_copy(update={"revision": 0})
        after = compile_region(new_fleet, region).model_copy(update={"revision": 0})
        if before != after:
            out[region] = changed_models(before, after)
    return out


def changed_models(before: RegionSnapshot, after: RegionSnapshot) -> list[str]:
    """The models whose part of a region's snapshot differs (every model, where a part that
    concerns them all does)."""
    old, new = by_model(before), by_model(after)
    changed = {m for m in old.keys() | new.keys() if old.get(m) != new.get(m)}
    if ALL in changed:
        changed = (old.keys() | new.keys()) - {ALL}
    return sorted(changed)


def by_model(snapshot: RegionSnapshot) -> dict[str, list[Any]]:
    """A region's snapshot split by the model each part concerns."""
    parts: dict[str, list[Any]] = {}

    def put(model: str | None, *part: Any) -> None:
        parts.setdefault(model or ALL, []).append(part)

    of_deployment = {d.name: d.model for d in snapshot.deployments}
    for info in snapshot.models:
        put(info.name, "model", info)
    for deployment in snapshot.deployments:
        put(deployment.model, "deployment", deployment)
    for node in snapshot.nodes:
        for engine in node.engines:
            put(engine.model, "engine", node.name, engine)
    for unplaced in snapshot.unplaced:
        put(of_deployment.get(unplaced.deployment), "unplaced", unplaced)
    for worker in snapshot.workers:
        put(worker.model, "worker", worker)
    for route in snapshot.routes:
        put(route.model, "route", route)
    for chain in snapshot.fallback:
        put(chain.model, "fallback", chain)
    for tiered in snapshot.tiered:
        for tier in tiered.tiers:
            put(tier, "tiered", tiered)
    for adapter in snapshot.adapters:  # judged on its base model's traffic
        put(adapter.base_model, "adapter", adapter)
    return parts


def plan(policy: RolloutPolicySpec, state: FleetState, changed: dict[str, list[str]]) -> list[Wave]:
    regions = list(changed)
    if not regions:
        return []
    bake = policy.bake_s

    def size(region: str) -> tuple[int, str]:
        return region_weight(state, region), region

    def nodes(region: str) -> list[str]:
        return sorted(
            name
            for name, node in state.nodes.items()
            if node.region == region and node.state is NodeState.ACTIVE
        )

    canary = policy.canary_region
    if canary not in regions:
        with_agents = [r for r in regions if nodes(r)] or regions
        canary = min(with_agents, key=size)
    waves: list[Wave] = []
    members = nodes(canary)
    if policy.canary is Canary.NODE and len(members) > 1:
        waves.append(Wave(name=f"canary node {members[0]}", targets=[f"node:{members[0]}"],
                          bake_s=bake, models=changed[canary]))  # fmt: skip
        waves.append(Wave(name=f"canary region {canary}", targets=[f"region:{canary}"],
                          bake_s=bake, models=changed[canary]))  # fmt: skip
    else:
        waves.append(Wave(name=f"canary {canary}", targets=[f"region:{canary}"], bake_s=bake,
                          models=changed[canary]))  # fmt: skip
    left = sorted((r for r in regions if r != canary), key=size)
    for spec in policy.waves:
        if not left:
            break
        if spec.regions is not None:
            take = [r for r in left if r in spec.regions]
        elif spec.count is not None:
            take = left[: spec.count]
        else:
            take = left[: math.ceil(len(left) * (spec.percent or 100) / 100)]
        if take:
            waves.append(_wave(take, bake if spec.bake_s is None else spec.bake_s, changed))
            left = [r for r in left if r not in take]
    if left:
        waves.append(_wave(left, bake, changed))
    return waves


def _wave(regions: list[str], bake_s: float, changed: dict[str, list[str]]) -> Wave:
    models = sorted({m for r in regions for m in changed[r]})
    return Wave(name=", ".join(regions), targets=[f"region:{r}" for r in regions], bake_s=bake_s,
                models=models)  # fmt: skip
