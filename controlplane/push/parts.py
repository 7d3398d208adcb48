"""Each region's snapshot as its nodes receive it, compiled again only where its inputs moved.

A region's snapshot is sent in two parts: the shared part (tenants, keys, routes, workers,
fallback, peers), the same for all of its nodes, and each node's engine plan, for that node
alone. `parts_of` makes them from a whole compile (`compile_region`), and is the reference;
`PartsCompiler` gives the same parts, byte for byte, but remembers what each section of each
region was compiled from and compiles a section again only when those inputs changed. A
tenant's change recompiles the tenants of every region and nothing else; a node's, the
placement of its region (and the quota shares, when the region's capacity moved).

Inputs are compared by identity first: the fleet reader (services/fleet_state.py) keeps the
objects of what did not change, so an unchanged section costs a pass over references.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

from meridian_pb.fleet.v1 import fleet_pb2 as pb
from pydantic import BaseModel

from controlplane.push.wire import to_wire, wire_items, wire_message
from controlplane.snapshot import FleetState, RegionSnapshot
from controlplane.snapshot.compiler import (
    kv_event_models,
    placement,
    region_catalog,
    region_routes,
    tenant_grants,
)
from controlplane.snapshot.index import FleetIndex

T = TypeVar("T")
Key = tuple[Hashable, str, str]  # (label, region, section)


@dataclass(frozen=True)
class RegionParts:
    shared: pb.Snapshot  # revision and node_count set; no digest, nodes or peer load
    plans: dict[str, pb.NodePlan]  # by node: the region's active nodes


def parts_of(snapshot: RegionSnapshot) -> RegionParts:
    """The parts of a whole compile."""
    message = to_wire(snapshot)
    plans = {}
    for plan in message.nodes:
        own = pb.NodePlan()
        own.CopyFrom(plan)
        plans[plan.name] = own
    message.ClearField("nodes")
    message.ClearField("digest")
    message.node_count = len(plans)
    return RegionParts(message, plans)


class PartsCompiler:
    """`parts_of(compile_region(state, region))` for every region, section by section.

    `label` keeps apart fleets compiled side by side (a rollout's targets holding different
    intents), so that they do not evict each other's sections.
    """

    def __init__(self) -> None:
        self._memo: dict[Key, tuple[tuple[Any, ...], Any]] = {}
        self._items: dict[Key, dict[str, tuple[BaseModel, Any]]] = {}
        self.sections_compiled = 0  # for tests and the benchmark: sections not reused

    def compile(
        self, state: FleetState, label: Hashable = None, regions: list[str] | None = None
    ) -> dict[str, RegionParts]:
        """Every region's parts (those of `regions` only, when given)."""
        index = FleetIndex.of(state)
        wanted = sorted(state.regions) if regions is None else regions
        out = {region: self._region(state, region, index, label) for region in wanted}
        self._drop(lambda key: key[0] == label and key[1] not in state.regions)
        return out

    def forget(self, label: Hashable) -> None:
        """Drop what was remembered for a label no longer compiled."""
        self._drop(lambda key: key[0] == label)

    def _drop(self, gone: Callable[[Key], bool]) -> None:
        for key in [k for k in self._memo if gone(k)]:
            del self._memo[key]
            self._items.pop(key, None)

    def _region(
        self, state: FleetState, region: str, index: FleetIndex, label: Hashable
    ) -> RegionParts:
        spec = state.regions[region]
        routes = region_routes(state, region, index)
        events = kv_event_models(routes)
        nodes = index.nodes.get(region, {})
        deployments = index.deployments[region]
        models = {d.model: state.models[d.model] for d in deployments.values()}
        slots = {e: s for n in nodes for e, s in index.slots.get(n, {}).items()}
        planned = {n: state.planned[n] for n in deployments if n in state.planned}

        def placed() -> tuple[dict[str, Any], list[Any], list[Any]]:
            # placement() reads no more than this (see its docstring)
            alone = FleetState.model_construct(
                revision=state.revision,
                regions={region: spec},
                nodes=nodes,
                models=models,
                deployments=deployments,
                slots=slots,
                planned=planned,
            )
            done = placement(alone, region, events)
            plans = {p.name: p for p in wire_items("nodes", done.nodes)}
            return plans, wire_items("unplaced", done.unplaced), wire_items("workers", done.workers)

        plans, unplaced, workers = self._cached(
            (label, region, "placement"),
            (spec.state, nodes, deployments, models, slots, planned, events),
            placed,
        )
        regions = tuple(sorted((r, s.state, s.jurisdiction) for r, s in state.regions.items()))
        key = (label, region, "tenants")
        tenants = self._cached(
            key,
            (spec.jurisdiction, state.tenants, state.api_keys, regions, index.weights),
            lambda: self._each(key, "tenants", tenant_grants(state, region, index)),
        )
        catalog = region_catalog(state, region, index, routes)
        shared = wire_message({name: _json(value) for name, value in catalog.items()})
        shared.unplaced.extend(unplaced)
        shared.workers.extend(workers)
        shared.tenants.extend(tenants)
        shared.node_count = len(plans)
        return RegionParts(shared, plans)

    def _cached(self, key: Key, inputs: tuple[Any, ...], make: Callable[[], T]) -> T:
        hit = self._memo.get(key)
        if hit is not None and _same(hit[0], inputs):
            result: T = hit[1]
            return result
        self.sections_compiled += 1
        made = make()
        self._memo[key] = (inputs, made)
        return made

    def _each(self, key: Key, field: str, items: list[Any]) -> list[Any]:
        """The items as messages, each converted again only when it changed."""
        known = self._items.get(key, {})
        fresh = [i for i in items if i.name not in known or known[i.name][0] != i]
        converted = dict(zip((i.name for i in fresh), wire_items(field, fresh), strict=True))
        kept = {
            i.name: (i, converted[i.name] if i.name in converted else known[i.name][1])
            for i in items
        }
        self._items[key] = kept
        return [kept[i.name][1] for i in items]


def _json(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_json(v) for v in value]
    return value


def _same(before: tuple[Any, ...], now: tuple[Any, ...]) -> bool:
    # the remembered inputs are still referenced, so an identical object is the same one
    return all(a is b or a == b for a, b in zip(before, now, strict=True))
