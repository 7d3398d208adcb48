"""Nodes per node pool, from the GPUs each region's engines want of its pools: a pure
function, like the planner's core (core.py), that the pool keeper (pools.py) calls after the
engines are sized.

- The GPUs that must not be spot (one engine of each deployment, so that a preemption wave
  takes none's last) come from the region's pools that are not, cheapest first; the rest
  from the cheapest pools of all.
- Every pool within its bounds, at its minimum at least. A region its pools cannot hold says
  by how much.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Pool:
    """A node pool the planner may resize (it names its cloud's group)."""

    name: str
    region: str
    gpus_per_node: int
    price_per_gpu_hour: float
    min_nodes: int
    max_nodes: int
    nodes: int  # the group's desired count now
    spot: bool = False


@dataclass(frozen=True)
class PoolDecision:
    pool: str
    region: str
    current: int
    target: int
    reason: str

    def describe(self) -> str:
        arrow = f"{self.current}→{self.target}" if self.target != self.current else "holds"
        return f"{self.region} pool {self.pool} {arrow}: {self.reason}"


def size_pools(
    pools: Iterable[Pool],
    gpus_wanted: Mapping[str, int],
    on_demand: Mapping[str, int] | None = None,
) -> list[PoolDecision]:
    """Nodes per pool for the GPUs each region's engines want of its pools (`gpus_wanted`,
    by region; a region not named is left as it is): first the GPUs that must not be spot
    (`on_demand`, by region: one engine of each deployment, so that a preemption wave takes
    none's last) from its pools that are not, cheapest first; then the rest from the
    cheapest pools of all. Each within its bounds, every pool at its minimum at least. A
    region its pools cannot hold says by how much."""
    out = []
    by_region: dict[str, list[Pool]] = {}
    for pool in pools:
        by_region.setdefault(pool.region, []).append(pool)
    for region, mine in sorted(by_region.items()):
        if region not in gpus_wanted:
            out += [PoolDecision(p.name, region, p.nodes, p.nodes, "no plan for its region")
                     for p in mine]  # fmt: skip
            continue
        want = gpus_wanted[region]
        targets = {p.name: p.min_nodes for p in mine}
        cheapest = sorted(mine, key=lambda p: (p.price_per_gpu_hour, p.name))

        floor = min(want, (on_demand or {}).get(region, 0))
        steady = [p for p in cheapest if not p.spot]
        if floor and steady and len(steady) < len(mine):
            _fill(targets, floor, steady)
        _fill(targets, want, cheapest)
        short = max(0, want - sum(targets[p.name] * p.gpus_per_node for p in mine))
        for p in mine:
            why = f"{want} GPUs wanted in {region}, cheapest pools first"
            if floor and steady and len(steady) < len(mine):
                why += f" ({floor} of them not spot)"
            if short:
                why += f"; short by {short}: every pool at its maximum"
            out.append(PoolDecision(p.name, region, p.nodes, targets[p.name], why))
    return out


def _fill(targets: dict[str, int], wanted: int, chosen: list[Pool]) -> None:
    """Nodes added to `targets`, pool by pool in the order given, until the chosen pools hold
    `wanted` GPUs or are all at their maximum."""
    covered = sum(targets[p.name] * p.gpus_per_node for p in chosen)
    for pool in chosen:
        if covered >= wanted:
            break
        more = min(pool.max_nodes - targets[pool.name],
                   math.ceil((wanted - covered) / pool.gpus_per_node))  # fmt: skip
        targets[pool.name] += max(0, more)
        covered += max(0, more) * pool.gpus_per_node
