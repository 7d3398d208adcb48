"""A deployment's `autoscale` block (issue 42): stored and shown as given, checked against
the deployment it bounds, and a deployment without one keeps its fixed replicas."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kits.controlplane import Api
from tests.kits.fleet_docs import BASE

DEPLOYMENT = {"name": "llama-east", "model": "llama-8b", "region": "us-east"}
BOUNDS = {"min_replicas": 2, "max_replicas": 8}


@pytest.fixture
async def base(api: Api) -> Api:
    assert (await api.client.post("/v1/apply", json=BASE)).status_code == 200
    return api


async def _create(api: Api, **spec: Any) -> Any:
    return await api.client.post("/v1/deployments", json={**DEPLOYMENT, **spec})


async def test_bounds_are_stored_with_their_defaults_and_replicas_start_at_the_minimum(
    base: Api,
) -> None:
    made = await _create(base, autoscale=BOUNDS)
    assert made.status_code == 201, made.text
    shown = (await base.client.get("/v1/deployments/llama-east")).json()
    assert shown["replicas"] == 2
    assert shown["autoscale"] == {**BOUNDS, "target_attainment": 0.95, "headroom": 0.2,
                                  "scale_to_zero": False, "wake_wait_s": 30,
                                  "local_share": 1.0}  # fmt: skip

    changed = await base.client.patch(
        "/v1/deployments/llama-east",
        json={"autoscale": {**BOUNDS, "max_replicas": 4, "headroom": 0.5}},
        headers={"If-Match": '"1"'},
    )
    assert changed.status_code == 200, changed.text
    shown = (await base.client.get("/v1/deployments/llama-east")).json()
    assert (shown["autoscale"]["max_replicas"], shown["autoscale"]["headroom"]) == (4, 0.5)


async def test_without_a_block_replicas_stay_fixed_as_before(base: Api) -> None:
    made = await _create(base, replicas=3)
    assert made.status_code == 201, made.text
    shown = (await base.client.get("/v1/deployments/llama-east")).json()
    assert (shown["replicas"], shown["autoscale"]) == (3, None)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"autoscale": {"min_replicas": 5, "max_replicas": 2}},
         "min_replicas must not exceed max_replicas"),
        ({"autoscale": {"min_replicas": 0, "max_replicas": 2}},
         "min_replicas 0 needs scale_to_zero: true"),
        ({"autoscale": BOUNDS, "replicas": 9},
         "replicas (9) must be within autoscale's min_replicas (2) and max_replicas (8)"),
        ({"autoscale": BOUNDS, "pd_mode": "disaggregated", "prefill_replicas": 1,
          "decode_replicas": 1}, "autoscale sizes unified deployments"),
        ({"autoscale": BOUNDS, "backend": "external", "external_urls": ["http://10.0.0.9:1"]},
         "autoscale starts and stops engines: not external ones"),
        ({"autoscale": {**BOUNDS, "target_attainment": 1.5}}, "less than or equal to 0.999"),
        ({"autoscale": {**BOUNDS, "surge": 2}}, "Extra inputs are not permitted"),
    ],
)  # fmt: skip
async def test_bounds_that_cannot_hold_are_refused_and_change_nothing(
    base: Api, spec: dict[str, Any], says: str
) -> None:
    before = await base.revision()
    refused = await _create(base, **spec)
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert body["code"] == "validation_failed", body
    assert says in refused.text, body
    assert (await base.client.get("/v1/deployments/llama-east")).status_code == 404
    assert await base.revision() == before


async def test_scale_to_zero_may_start_at_one_and_go_to_zero(base: Api) -> None:
    made = await _create(base, autoscale={"min_replicas": 0, "max_replicas": 3,
                                          "scale_to_zero": True})  # fmt: skip
    assert made.status_code == 201, made.text
    shown = (await base.client.get("/v1/deployments/llama-east")).json()
    assert shown["replicas"] == 1  # it serves from the start; the planner may take it to 0
