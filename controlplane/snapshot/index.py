"""What every region's compile looks up, gathered once per fleet state. No I/O."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.domain import NodeState
from controlplane.schemas.fleet import DeploymentSpec, NodeSpec
from controlplane.snapshot.types import FleetState, KeyGrant, Slot


@dataclass(frozen=True)
class FleetIndex:
    """What every region's compile looks up, gathered once per fleet state."""

    nodes: dict[str, dict[str, NodeSpec]]  # by region, then name
    deployments: dict[str, dict[str, DeploymentSpec]]  # by region, then name (sorted)
    slots: dict[str, dict[str, Slot]]  # by node, then engine id
    weights: dict[str, int]  # each region's share of capacity (region_weight)
    keys: dict[str, list[KeyGrant]]  # each tenant's keys, in order of the keys' names

    @classmethod
    def of(cls, state: FleetState) -> FleetIndex:
        nodes: dict[str, dict[str, NodeSpec]] = {r: {} for r in state.regions}
        for name, node in sorted(state.nodes.items()):
            nodes.setdefault(node.region, {})[name] = node
        deployments: dict[str, dict[str, DeploymentSpec]] = {r: {} for r in state.regions}
        for name, d in sorted(state.deployments.items()):
            deployments.setdefault(d.region, {})[name] = d
        slots: dict[str, dict[str, Slot]] = {}
        for engine, slot in state.slots.items():
            slots.setdefault(slot.node, {})[engine] = slot
        weights = {}
        for region in state.regions:
            gpus = sum(len(n.gpus) for n in nodes[region].values() if n.state is NodeState.ACTIVE)
            weights[region] = gpus + sum(len(d.external_urls) for d in deployments[region].values())
        keys: dict[str, list[KeyGrant]] = {}
        for _, k in sorted(state.api_keys.items()):
            grant = KeyGrant(prefix=k.prefix, key_hash=k.key_hash, expires_at=k.expires_at)
            keys.setdefault(k.tenant, []).append(grant)
            if k.previous_hash is not None:  # a rotation's overlap: the secret before it
                before = KeyGrant(prefix=k.prefix, key_hash=k.previous_hash,
                                  expires_at=k.previous_expires_at)  # fmt: skip
                keys[k.tenant].append(before)
        return cls(nodes, deployments, slots, weights, keys)
