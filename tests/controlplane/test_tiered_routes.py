"""Tiered routes through the control plane: what the API takes and refuses (each refusal
changes nothing), and what a region's agents get: the tiers it serves, the table cut to
them, the tenants' opt-in and floor."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agents.config import compile_config
from controlplane.push.wire import to_wire
from controlplane.snapshot import compile_region
from tests.kits.controlplane import Api
from tests.kits.fleet_docs import BASE, example, state_from

STRONG = {"name": "llama-70b", "source": "meta-llama/Llama-3.1-70B-Instruct",
          "context_length": 8192}  # fmt: skip
ROUTE = {"name": "chat-auto", "tiers": ["llama-8b", "llama-70b"]}


@pytest.fixture
async def base(api: Api) -> Api:
    document = copy.deepcopy(BASE)
    document["models"].append(STRONG)
    assert (await api.client.post("/v1/apply", json=document)).status_code == 200
    return api


async def _refused(api: Api, plural: str, body: dict[str, Any], status: int, code: str) -> Any:
    before = await api.revision()
    response = await api.client.post(f"/v1/{plural}", json=body)
    assert response.status_code == status, response.text
    problem = response.json()
    assert problem["code"] == code, problem
    assert await api.revision() == before
    return problem


async def test_a_tiered_route_is_written_read_and_refused_when_wrong(base: Api) -> None:
    made = await base.create("tiered-routes", ROUTE)
    assert made["tiers"] == ["llama-8b", "llama-70b"]
    assert made["capacity_moves"] is True
    assert made["classifier"] is None
    read = (await base.client.get("/v1/tiered-routes/chat-auto")).json()
    assert read["tiers"] == made["tiers"]
    problem = await _refused(base, "tiered-routes", {"name": "other", "tiers": ["llama-8b",
                             "atlantis"]}, 422, "unknown_reference")  # fmt: skip
    assert problem["errors"][0]["field"] == "tiers.1"
    # a tiered route and a model share the names clients ask for
    await _refused(base, "tiered-routes", {**ROUTE, "name": "llama-8b"}, 409, "name_taken")
    await _refused(base, "models", {**STRONG, "name": "chat-auto"}, 409, "name_taken")
    table = {"bias": 0, "weights": {"code": 1.0}, "thresholds": [0.5, 1.0]}
    problem = await _refused(base, "tiered-routes", {**ROUTE, "name": "t2", "classifier": table},
                             422, "validation_failed")  # fmt: skip
    assert "2 tiers need 1 thresholds" in str(problem["errors"])
    bad = {"bias": 0, "weights": {"vibes": 1.0}, "thresholds": [0.5]}
    await _refused(base, "tiered-routes", {**ROUTE, "name": "t3", "classifier": bad}, 422,
                   "validation_failed")  # fmt: skip


async def test_a_tenant_opts_in_with_a_floor_that_must_be_a_model(base: Api) -> None:
    await _refused(base, "tenants", {"name": "t", "tiering": True, "tier_floor": "atlantis"},
                   422, "unknown_reference")  # fmt: skip
    made = await base.create("tenants", {"name": "t", "tiering": True, "tier_floor": "llama-70b"})
    assert (made["tiering"], made["tier_floor"]) == (True, "llama-70b")


def test_each_region_gets_the_tiers_it_serves_and_the_table_cut_to_them() -> None:
    document = example()
    small, strong = document["models"][0]["name"], document["models"][1]["name"]
    middle = "llama-mid"
    document["models"].append({**document["models"][0], "name": middle})
    table = {"bias": -1.0, "weights": {"code": 2.0, "prompt_tokens_log2": 0.1},
             "thresholds": [0.0, 1.0]}  # fmt: skip
    document["tiered_routes"] = [
        {
            "name": "chat-auto",
            "tiers": [small, middle, strong],
            "classifier": table,
            "cascade": {"signals": ["length"]},
        }
    ]
    document["tenants"][0] |= {"tiering": True, "tier_floor": small}
    state = state_from(document)
    # us-east serves the small and the strong model (not the middle one): the middle tier's
    # band goes to the stronger, the next one up
    config = compile_config(to_wire(compile_region(state, "us-east")))
    route = config.tiered["chat-auto"]
    assert route.tiers == (small, strong)
    assert route.table.thresholds == (0.0,)
    assert route.table.weights == {"code": 2.0, "prompt_tokens_log2": 0.1}
    assert route.cascade is not None
    assert route.cascade.signals == {"length"}
    assert route.capacity_moves
    assert route.external_url is None
    tenant = config.tenants[document["tenants"][0]["name"]]
    assert (tenant.tiering, tenant.tier_floor) == (True, small)
    assert not config.tenants[document["tenants"][1]["name"]].tiering
    # eu-west serves only the small one: a route of one tier
    alone = compile_config(to_wire(compile_region(state, "eu-west"))).tiered["chat-auto"]
    assert alone.tiers == (small,)
    assert alone.table.thresholds == ()
