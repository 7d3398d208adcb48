"""Every tenant's leases from the fleet's demand: which agents share a quota, what is kept
aside for those that cannot take a lease now, and each one's share. No I/O.

An agent takes part in a tenant's quota when it streams to the control plane and reports
its demand, in an active region the tenant may be served in (its jurisdictions). The budget
it shares is the quota less what is kept aside for the tenant's other agents:

- an agent that went away (its stream ended) keeps the lease it held until that lease has
  surely expired on its side (`ttl_s` after the leader saw it go, plus a margin);
- after that, and for an agent that never took a lease, its static share (the region's
  share by GPUs, split over the region's nodes), as it falls back to that, until it has
  been away for `forget_s` (a node gone for good).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from controlplane.domain import NodeState, RegionState
from controlplane.services.quotas.allocate import Claim, allocate, settle
from controlplane.services.quotas.demand import NodeDemand
from controlplane.services.quotas.spend import plan_spend
from controlplane.snapshot import FleetState
from controlplane.snapshot.shares import region_shares

DIMENSIONS = ("requests_per_minute", "tokens_per_minute", "concurrent_requests")
MARGIN = timedelta(seconds=2)

TenantLeases = dict[str, Any]  # {"quota": {...}, "reserved": {...}, "leases": {node: {...}}}


@dataclass(frozen=True)
class Timing:
    ttl_s: float
    forget_s: float


def plan(
    state: FleetState,
    demand: dict[str, NodeDemand],
    connected: set[str],
    given: dict[str, TenantLeases],
    away: dict[str, datetime],
    now: datetime,
    timing: Timing,
) -> dict[str, TenantLeases]:
    """Each tenant with a quota: its leases, per agent."""
    out: dict[str, TenantLeases] = {}
    split_over = _static(state)
    for name, tenant in sorted(state.tenants.items()):
        quotas = {"requests_per_minute": tenant.requests_per_minute,
                  "tokens_per_minute": tenant.tokens_per_minute,
                  "concurrent_requests": tenant.max_concurrency}  # fmt: skip
        if tenant.disabled or (all(q is None for q in quotas.values()) and not tenant.budgets):
            continue
        regions = region_shares(state, name)  # region -> its part of the quota, 0 to 1
        nodes = _nodes(state, regions, connected | set(away))
        taking = sorted(n for n in nodes if n in connected and n in demand)
        aside = [n for n in nodes if n not in taking]
        held = given.get(name, {}).get("leases", {})
        leases: dict[str, dict[str, Any]] = {n: {"region": state.nodes[n].region} for n in taking}
        reserved: dict[str, float] = {}
        for dim, quota in quotas.items():
            if quota is None:
                continue
            home = {n: state.nodes[n].region for n in nodes}
            static = {n: quota * regions[home[n]] / split_over[home[n]] for n in nodes}
            kept = sum(_kept(held.get(n, {}).get(dim), static[n], away.get(n), now, timing)
                       for n in aside)  # fmt: skip
            budget = max(0.0, quota - kept)
            wants = {n: _want(demand[n], name, dim) for n in taking}
            claims = {n: Claim(wants[n], static[n]) for n in taking}
            shares = allocate(budget, claims)
            before = {n: float(held[n][dim]) for n in taking
                      if n in held and held[n].get(dim) is not None}  # fmt: skip
            for node, share in settle(shares, before, budget).items():
                leases[node][dim] = round(share, 3)
            reserved[dim] = round(kept, 3)
        out[name] = {"quota": quotas, "reserved": reserved, "leases": leases}
        if tenant.budgets:
            out[name]["spend"] = plan_spend(state, name, regions, split_over, demand, connected,
                                            given.get(name, {}).get("spend", {}),
                                            now.timestamp())  # fmt: skip
    return out


def _nodes(state: FleetState, regions: dict[str, float], known: set[str]) -> list[str]:
    """The tenant's agents: nodes the leader knows, in regions that serve the tenant."""
    return sorted(
        n
        for n in known
        if n in state.nodes
        and state.nodes[n].region in regions
        and state.regions[state.nodes[n].region].state is RegionState.ACTIVE
    )


def _static(state: FleetState) -> dict[str, int]:
    """How many nodes each region's static share is split over, as the agents split it: its
    active nodes (those its snapshot places; at least one)."""
    counts = dict.fromkeys(state.regions, 1)
    active = Counter(s.region for s in state.nodes.values() if s.state is NodeState.ACTIVE)
    counts.update({r: max(1, c) for r, c in active.items()})
    return counts


def _kept(
    lease: float | None, static: float, since: datetime | None, now: datetime, timing: Timing
) -> float:
    """What an agent that takes no lease now may still admit, per minute."""
    gone = (now - since) if since is not None else timedelta(0)
    if lease is not None and gone < timedelta(seconds=timing.ttl_s) + MARGIN:
        return max(float(lease), static)  # its lease, or its static share once it expires
    if gone < timedelta(seconds=timing.forget_s):
        return static
    return 0.0


def _want(demand: NodeDemand, tenant: str, dim: str) -> float:
    told = demand.tenants.get(tenant)
    if told is None:
        return 0.0
    if dim == "concurrent_requests":
        return told.wants_concurrent
    return told.wants_requests if dim == "requests_per_minute" else told.wants_tokens
