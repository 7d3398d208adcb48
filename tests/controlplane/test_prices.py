"""A model's prices and a tenant's discount through the admin API: validated, a price in
effect kept as it was, and compiled into the snapshot the agents price usage from."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from agents.config import compile_config
from controlplane.push.wire import to_wire
from controlplane.snapshot import compile_region
from tests.kits.controlplane import Api
from tests.kits.fleet_docs import BASE, example, state_from

MODEL = "llama-8b"
LLAMA = "llama-3.1-8b-instruct"


@pytest.fixture
async def base(api: Api) -> Api:
    assert (await api.client.post("/v1/apply", json=BASE)).status_code == 200
    return api


def _at(delta: timedelta) -> str:
    return (datetime.now(UTC) + delta).isoformat()


async def _put(api: Api, model: dict[str, Any]) -> httpx.Response:
    etag = f'"{model["version"]}"'
    return await api.client.put(f"/v1/models/{MODEL}", json=model, headers={"If-Match": etag})


async def test_a_price_in_effect_cannot_change_and_a_new_one_starts_later(base: Api) -> None:
    model = (await base.client.get(f"/v1/models/{MODEL}")).json()
    past = {"effective_from": _at(-timedelta(days=1)), "input": 0.15, "output": 0.6}
    made = await _put(base, model | {"pricing": {"prices": [past]}})
    assert made.status_code == 409, made.text  # it would price usage already recorded
    assert made.json()["code"] == "price_in_effect"
    soon = past | {"effective_from": _at(timedelta(seconds=2))}
    made = await _put(base, model | {"pricing": {"prices": [soon]}})
    assert made.status_code == 200, made.text
    model = made.json()
    # until it is in effect it may change; then it stays as it is
    while (answer := await _put(base, model | {"pricing": {"prices": [
            model["pricing"]["prices"][0] | {"input": model["pricing"]["prices"][0]["input"]
                                             + 0.01}]}})).status_code == 200:  # fmt: skip
        model = answer.json()
    assert answer.status_code == 409, answer.text
    assert answer.json()["code"] == "price_in_effect"
    later = {"effective_from": _at(timedelta(days=30)), "input": 0.3, "output": 1.2}
    model["pricing"]["prices"].append(later)
    assert (await _put(base, model)).status_code == 200
    model = (await base.client.get(f"/v1/models/{MODEL}")).json()
    bad = await _put(base, model | {"pricing": {"prices": [later | {"input": 1e-9}]}})
    assert bad.status_code == 422, bad.text
    assert len((await base.client.get(f"/v1/models/{MODEL}")).json()["pricing"]["prices"]) == 2


async def test_a_discount_outside_0_to_100_is_refused(base: Api) -> None:
    for bad in (-1, 101, "ten"):
        tenant = {"name": "t", "price_discount_percent": bad}
        answer = await base.client.post("/v1/tenants", json=tenant)
        assert answer.status_code == 422, bad
    made = await base.client.post("/v1/tenants", json={"name": "t", "price_discount_percent": 12.5})
    assert made.status_code == 201, made.text


def test_the_agents_price_usage_as_the_admin_api_declared() -> None:
    doc = example()
    llama = next(m for m in doc["models"] if m["name"] == LLAMA)
    llama["pricing"] = {
        "prices": [{"effective_from": "2026-01-01T00:00:00Z", "input": 0.15, "output": 0.6}],
        "class_multipliers": {"batch": 0.5},
    }
    next(t for t in doc["tenants"] if t["name"] == "acme")["price_discount_percent"] = 20
    config = compile_config(to_wire(compile_region(state_from(doc), "us-east")))
    prices = config.models[LLAMA].prices
    assert prices is not None
    at = datetime(2026, 6, 1, tzinfo=UTC).timestamp()
    discount = config.tenants["acme"].discount
    assert discount == pytest.approx(0.2)
    # 1000 in at 150 nanos, 100 out at 600; batch at half; 20% off
    assert prices.cost_nanos(at, 1000, 0, 100, "batch", discount) == 84_000
    assert prices.cost_nanos(at - 365 * 86400, 1000, 0, 100, "batch") is None
