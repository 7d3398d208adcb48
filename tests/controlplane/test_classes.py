"""Service classes as identity and policy: validated by the admin API, compiled into each
region's snapshot, and read by the agents as they will enforce them."""

from __future__ import annotations

import pytest
from meridian_pb.fleet.v1.classes import NAMES, ServiceClass

from agents.config import compile_config
from controlplane.push.wire import to_wire
from controlplane.schemas.classes import ServiceClassName
from controlplane.snapshot import compile_region
from tests.kits.controlplane import Api
from tests.kits.fleet_docs import BASE, example, state_from

LLAMA = "llama-3.1-8b-instruct"


@pytest.fixture
async def base(api: Api) -> Api:
    assert (await api.client.post("/v1/apply", json=BASE)).status_code == 200
    return api


def test_the_admin_api_and_the_agents_name_the_same_classes() -> None:
    assert tuple(ServiceClassName) == NAMES


def test_classes_reach_the_agents_as_they_were_declared() -> None:
    document = example()
    acme = next(t for t in document["tenants"] if t["name"] == "acme")
    acme.update(default_class="flex", class_ceiling="interactive")
    policy = next(p for p in document["routing_policies"] if p["name"] == "llama-default")
    policy["classes"] = {"batch": {"max_wait_s": 30, "slack": 0.1}, "preempt": True}
    out = next(r for r in document["fallback_rules"] if r["name"] == "us-east-out")
    out["classes"] = ["interactive"]
    document["fallback_rules"].append(
        {"name": "us-east-flex", "region": "us-east", "peers": ["us-west"],
         "classes": ["flex"]}
    )  # fmt: skip
    config = compile_config(to_wire(compile_region(state_from(document), "us-east")))
    tenant = config.tenants["acme"]
    assert (tenant.default_class, tenant.class_ceiling) == (
        ServiceClass.FLEX,
        ServiceClass.INTERACTIVE,
    )
    assert config.tenants["eurobank"].class_ceiling is ServiceClass.STANDARD  # the default
    classes = config.routes[LLAMA].classes
    assert classes.preempt
    assert classes.batch.max_wait_s == 30
    assert classes.batch.slack == 0.1
    assert classes.batch.weight == 1
    assert classes.interactive.reserve == 0.2
    chain = config.chain(LLAMA, "standard", ServiceClass.INTERACTIVE)
    assert chain is not None
    assert chain.rule == "us-east-out"
    chain = config.chain(LLAMA, "standard", ServiceClass.FLEX)
    assert chain is not None
    assert [p.region for p in chain.peers] == ["us-west"]
    assert config.chain(LLAMA, "standard", ServiceClass.STANDARD) is None  # stays home
    assert config.chain(LLAMA, "standard", ServiceClass.BATCH) is None


async def test_a_default_class_above_the_ceiling_is_refused(base: Api) -> None:
    response = await base.client.post(
        "/v1/tenants", json={"name": "t", "default_class": "interactive"}
    )
    assert response.status_code == 422, response.text
    assert "class_ceiling" in response.text
    response = await base.client.post("/v1/tenants", json={"name": "t", "class_ceiling": "gold"})
    assert response.status_code == 422
    assert (await base.client.get("/v1/tenants/t")).status_code == 404
    made = await base.client.post(
        "/v1/tenants",
        json={"name": "t", "default_class": "standard", "class_ceiling": "interactive"},
    )
    assert made.status_code == 201, made.text
    assert made.json()["class_ceiling"] == "interactive"


async def test_a_routing_policys_classes_are_checked_whole(base: Api) -> None:
    policy = {"name": "p", "model": "llama-8b", "policy": "cost"}
    for bad in (
        {"interactive": {"reserve": 0.5}, "standard": {"reserve": 0.5}},  # nothing left
        {"batch": {"weight": 0}},
        {"gold": {"weight": 1}},
    ):
        response = await base.client.post("/v1/routing-policies", json=policy | {"classes": bad})
        assert response.status_code == 422, bad
    made = await base.client.post(
        "/v1/routing-policies", json=policy | {"classes": {"flex": {"max_wait_s": 60}}}
    )
    assert made.status_code == 201, made.text
    assert made.json()["classes"]["flex"]["max_wait_s"] == 60


async def test_rules_of_one_scope_name_each_class_once(base: Api) -> None:
    regions = [r["name"] for r in (await base.client.get("/v1/regions")).json()["items"]]
    home, peer = regions[0], regions[1]
    rule = {"region": home, "peers": [peer]}
    first = await base.client.post("/v1/fallback-rules", json=rule | {"name": "a"})
    assert first.status_code == 201, first.text
    assert first.json()["classes"] == ["interactive", "standard"]
    clash = await base.client.post(
        "/v1/fallback-rules", json=rule | {"name": "b", "classes": ["flex", "standard"]}
    )
    assert clash.status_code == 422
    assert clash.json()["code"] == "invalid_fallback_chain"
    assert "standard" in clash.json()["detail"]
    apart = await base.client.post(
        "/v1/fallback-rules", json=rule | {"name": "b", "classes": ["flex"]}
    )
    assert apart.status_code == 201, apart.text
    other_model = await base.client.post(
        "/v1/fallback-rules", json=rule | {"name": "c", "model": "llama-8b"}
    )
    assert other_model.status_code == 201, other_model.text  # another scope
