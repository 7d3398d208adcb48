"""Where the leader keeps tenants' adapters loaded (controlplane/services/residency.py): hot
adapters on their share of a region's engines, the rest on one while room lasts and then on
none, within the engines' room, growing at once and shrinking only once demand has clearly
fallen and stayed down; and what it decides reaches the region's snapshot, as a fact, while
a bound tenant's adapter reaches no region outside its jurisdiction whatever its demand."""

from __future__ import annotations

from typing import Any, cast

from meridian_pb.fleet.v1.adapters import planned_slots

from agents.config import compile_config
from controlplane.db.engine import Database
from controlplane.push.wire import to_wire
from controlplane.services.residency import Plan, Residency, plan
from controlplane.snapshot import compile_region
from controlplane.snapshot.types import FleetState
from tests.kits.fleet_docs import example, state_from

REGION = "us-east"


def _state(engine_args: dict[str, Any] | None = None) -> tuple[FleetState, str]:
    document = example()
    small = document["models"][0]["name"]
    for d in document["deployments"]:
        if d["model"] == small and d["region"] == REGION:
            d["engine_args"] = {**d.get("engine_args", {}), **(engine_args or {})}
    document["adapters"] = [
        {"name": name, "base_model": small, "rank": 8, "source": f"/a/{name}",
         "tenants": ["acme"]}
        for name in ("hot", "warm", "cold")
    ]  # fmt: skip
    return state_from(document), small


def _planned(
    state: FleetState, rates: dict[str, float], engines: int, model: str,
    current: dict[str, int] | None = None,
) -> dict[str, int]:  # fmt: skip
    changes = plan(
        state,
        {(name, REGION): rps for name, rps in rates.items()},
        {(model, REGION): engines},
        {(name, REGION): n for name, n in (current or {}).items()},
        cold_rps=0.02,
    )
    return {c.adapter: c.engines for c in changes if c.region == REGION}


def test_adapters_in_demand_go_on_their_share_of_the_engines_the_rest_on_one_while_room_lasts(
) -> None:  # fmt: skip
    state, model = _state()
    rates = {"hot": 3.0, "warm": 0.5, "cold": 0.01}
    # 8 engines of 8 adapters each: room for all, the one without demand kept warm on one
    assert _planned(state, rates, 8, model) == {"hot": 8, "warm": 3, "cold": 1}
    assert _planned(state, rates, 1, model) == {"hot": 1, "warm": 1, "cold": 1}
    assert _planned(state, {}, 1, model) == {"cold": 1, "hot": 1, "warm": 1}  # none asked yet


def test_the_plan_fits_the_engines_room_busiest_first() -> None:
    state, model = _state({"max-loras-per-batch": 1})
    rates = {"hot": 3.0, "warm": 0.5, "cold": 0.3}
    assert _planned(state, rates, 2, model) == {"hot": 2}  # two engines, one adapter each
    state, model = _state({"max-loaded-loras": 2, "max-loras-per-batch": 1})
    # 3 engines of 2 each, one place of each kept for requests' loads: hot, the busiest, on
    # all 3, and no room left for the others (loaded where their requests go)
    assert _planned(state, rates, 3, model) == {"hot": 3}
    assert _planned(state, {"warm": 0.5}, 3, model) == {"warm": 3}
    # 4 engines of 256: 250 each planned, the rest kept for requests' loads
    state, model = _state({"max-loaded-loras": 256})
    assert _planned(state, rates, 4, model) == {"hot": 4, "warm": 2, "cold": 1}
    assert [planned_slots(n) for n in (0, 1, 2, 8, 50, 51, 256)] == [0, 1, 1, 7, 49, 49, 250]


def test_a_plan_shrinks_only_once_demand_has_clearly_fallen() -> None:
    state, model = _state()
    held = {"hot": 8, "warm": 3, "cold": 1}
    # less demand, not yet half: each keeps its engines
    assert _planned(state, {"hot": 2.6, "warm": 0.3}, 8, model, held) == {}
    # demand gone: each kept warm on one engine, as room allows
    assert _planned(state, {"hot": 0.0, "warm": 0.0}, 8, model, held) == {"hot": 1, "warm": 1}


def test_a_shrink_is_written_once_demand_has_stayed_down_and_growth_at_once() -> None:
    residency = Residency(cast(Database, None), period_s=5.0)
    current = {("hot", REGION): 4, ("warm", REGION): 1}
    shrink = Plan("hot", REGION, 1, 0.0, "quiet")
    grow = Plan("warm", REGION, 3, 2.0, "busy")
    assert residency._held([shrink, grow], current, now=100.0) == [grow]
    # a burst between quiet spells starts the count again
    assert residency._held([], current, now=110.0) == []
    assert residency._held([shrink], current, now=115.0) == []
    assert residency._held([shrink], current, now=140.0) == []  # 25 s of the 30
    assert residency._held([shrink], current, now=145.0) == [shrink]


def test_the_plan_reaches_the_regions_snapshot_and_a_bound_tenant_stays_home() -> None:
    document = example()
    small = document["models"][0]["name"]
    document["adapters"] = [
        {"name": "eurobank-legal", "base_model": small, "rank": 8, "source": "/a/legal",
         "tenants": ["eurobank"]},
    ]  # fmt: skip
    state = state_from(document, resident={"eurobank-legal": {"eu-west": 1, REGION: 1}})

    def resident(region: str) -> dict[str, int]:
        config = compile_config(to_wire(compile_region(state, region)))
        return {name: a.resident for name, a in config.adapters.items()}

    assert resident("eu-west") == {"eurobank-legal": 1}
    assert resident(REGION) == {}  # a plan for it here (there is none) would reach nothing
