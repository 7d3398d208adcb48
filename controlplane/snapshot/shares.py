"""A tenant's global quotas in shares per region, by the regions' capacity. No I/O."""

from __future__ import annotations

import math

from controlplane.domain import RegionState
from controlplane.snapshot.index import FleetIndex
from controlplane.snapshot.types import FleetState


def region_weight(state: FleetState, region: str) -> int:
    """A region's share of capacity: GPUs on its active nodes plus its external endpoints."""
    return FleetIndex.of(state).weights[region]


def split(quota: int, weights: dict[str, int]) -> dict[str, int]:
    """A quota in whole shares by weight (equal shares when no region has any), the largest
    remainders rounded up (ties to the name's order): the shares sum to the quota exactly,
    never above it."""
    if not weights:
        return {}
    total = sum(weights.values())
    if total == 0:
        weights, total = dict.fromkeys(weights, 1), len(weights)
    exact = {r: quota * w / total for r, w in weights.items()}
    shares = {r: math.floor(e) for r, e in exact.items()}
    left = quota - sum(shares.values())
    for region in sorted(exact, key=lambda r: (shares[r] - exact[r], r))[:left]:
        shares[region] += 1
    return shares


def whole_share(quota: int | None, weights: dict[str, int], region: str) -> int | None:
    """The region's whole share of a quota (none for a tenant barred from it: no weights)."""
    return None if quota is None else split(quota, weights).get(region, 0)


def exact_share(quota: int | None, weights: dict[str, int], region: str) -> float | None:
    """The region's exact share: the regions' shares sum to the quota, to rounding."""
    if quota is None:
        return None
    if region not in weights:
        return 0.0
    total = sum(weights.values())
    return quota * weights[region] / total if total else quota / len(weights)


def serving_weights(
    state: FleetState, tenant: str, weights: dict[str, int] | None = None
) -> dict[str, int]:
    """The regions that may serve the tenant (active, in its jurisdictions), by weight
    (`weights`: every region's, from FleetIndex, when known)."""
    allowed = state.tenants[tenant].allowed_jurisdictions
    weights = weights if weights is not None else FleetIndex.of(state).weights
    return {
        r: weights[r]
        for r, spec in state.regions.items()
        if spec.state is RegionState.ACTIVE and (allowed is None or spec.jurisdiction in allowed)
    }


def region_part(weights: dict[str, int], region: str) -> float:
    """The region's exact part, 0 to 1, of what is split by `weights` (none: not there)."""
    if region not in weights:
        return 0.0
    total = sum(weights.values())
    return weights[region] / total if total else 1 / len(weights)


def region_shares(state: FleetState, tenant: str) -> dict[str, float]:
    """Each serving region's exact part of the tenant's quotas, 0 to 1: the static shares."""
    weights = serving_weights(state, tenant)
    total = sum(weights.values())
    return {r: w / total if total else 1 / len(weights) for r, w in weights.items()}
