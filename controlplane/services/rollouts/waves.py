"""A rollout's waves, from the policy and the fleet as it is when the rollout begins. No I/O.

Only the regions whose snapshot the change alters are targets: a change to one region's
routing policy rolls out to that region alone (its canary node first, when it has several).
The canary region is the policy's, or the affected region with the fewest GPUs (the least
harm if it is wrong); the other regions follow smallest first.
"""

from __future__ import annotations

import math

from pydantic import BaseModel

from controlplane.domain import NodeState
from controlplane.schemas.rollout import Canary, RolloutPolicySpec
from controlplane.services.rollouts.compose import Intent, compose
from controlplane.snapshot import FleetState, compile_region
from controlplane.snapshot.shares import region_weight


class Wave(BaseModel):
    name: str
    targets: list[str]  # region:<name> or node:<name>
    bake_s: float


def affected(state: FleetState, base: Intent | None, new: Intent) -> list[str]:
    """The regions whose snapshot differs between the base intent and the new one."""
    old_fleet = state if base is None else compose(state, base)
    new_fleet = compose(state, new)
    out = []
    for region in sorted(state.regions):
        before = compile_region(old_fleet, region).model_copy(update={"revision": 0})
        after = compile_region(new_fleet, region).model_copy(update={"revision": 0})
        if before != after:
            out.append(region)
    return out


def plan(policy: RolloutPolicySpec, state: FleetState, regions: list[str]) -> list[Wave]:
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
                          bake_s=bake))  # fmt: skip
        waves.append(Wave(name=f"canary region {canary}", targets=[f"region:{canary}"],
                          bake_s=bake))  # fmt: skip
    else:
        waves.append(Wave(name=f"canary {canary}", targets=[f"region:{canary}"], bake_s=bake))
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
            waves.append(_wave(take, bake if spec.bake_s is None else spec.bake_s))
            left = [r for r in left if r not in take]
    if left:
        waves.append(_wave(left, bake))
    return waves


def _wave(regions: list[str], bake_s: float) -> Wave:
    return Wave(name=", ".join(regions), targets=[f"region:{r}" for r in regions], bake_s=bake_s)
