"""Node pools (issue 42): nodes alike in one cloud's region, with their price and limits,
declared like any kind, checked against the fleet, and joined by nodes of their region."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kits.controlplane import Api
from tests.kits.fleet_docs import BASE

POOL = {"name": "east-h100", "cloud": "aws", "region": "us-east", "gpu_model": "H100-80GB",
        "gpus_per_node": 8, "price_per_gpu_hour": 2.5, "max_nodes": 4}  # fmt: skip
NODE = {"name": "gpu-1", "region": "us-east", "hostname": "gpu-1.internal"}


@pytest.fixture
async def base(api: Api) -> Api:
    assert (await api.client.post("/v1/apply", json=BASE)).status_code == 200
    return api


async def test_a_pool_is_declared_shown_and_joined_by_a_node_of_its_region(base: Api) -> None:
    made = await base.client.post("/v1/node-pools", json=POOL)
    assert made.status_code == 201, made.text
    shown = (await base.client.get("/v1/node-pools/east-h100")).json()
    assert shown["spot"] is False
    assert shown["group"] is None  # sized by its operator, not the planner
    assert (shown["min_nodes"], shown["max_nodes"], shown["price_per_gpu_hour"]) == (0, 4, 2.5)
    node = await base.client.post("/v1/nodes", json={**NODE, "pool": "east-h100"})
    assert node.status_code == 201, node.text
    assert (await base.client.get("/v1/nodes/gpu-1")).json()["pool"] == "east-h100"

    # a pool with nodes is not deleted from under them, unless they go too
    refused = await base.client.delete("/v1/node-pools/east-h100", headers={"If-Match": "*"})
    assert refused.status_code == 409, refused.text
    assert refused.json()["code"] == "has_dependents"
    gone = await base.client.delete(
        "/v1/node-pools/east-h100?cascade=true", headers={"If-Match": "*"}
    )
    assert gone.status_code in (200, 204), gone.text
    assert (await base.client.get("/v1/nodes/gpu-1")).status_code == 404


async def test_a_fleet_document_declares_pools_before_the_nodes_that_join_them(api: Api) -> None:
    document = {**BASE, "node_pools": [POOL], "nodes": [{**NODE, "pool": "east-h100"}]}
    applied = await api.client.post("/v1/apply", json=document)
    assert applied.status_code == 200, applied.text
    assert (await api.client.get("/v1/nodes/gpu-1")).json()["pool"] == "east-h100"


@pytest.mark.parametrize(
    ("path", "body", "code", "says"),
    [
        ("/v1/node-pools", {**POOL, "min_nodes": 5}, "validation_failed",
         "min_nodes must not exceed max_nodes"),
        ("/v1/node-pools", {**POOL, "cloud": "gcp"}, "validation_failed",
         "region 'us-east' is on cloud 'aws', not 'gcp'"),
        ("/v1/node-pools", {**POOL, "region": "nowhere"}, "unknown_reference",
         "no region named 'nowhere'"),
        ("/v1/node-pools", {**POOL, "price_per_gpu_hour": -1}, "validation_failed",
         "greater than or equal to 0"),
        ("/v1/node-pools", {**POOL, "group": "east-h100"}, "validation_failed",
         "an aws group is aws-region/group-name, not 'east-h100'"),
        ("/v1/node-pools", {**POOL, "cloud": "gcp", "region": "eu-west", "group": "eu-pool"},
         "validation_failed", "a gcp group is project/zone/manager, not 'eu-pool'"),
        ("/v1/nodes", {**NODE, "pool": "nowhere"}, "unknown_reference",
         "no node pool named 'nowhere'"),
        ("/v1/nodes", {**NODE, "region": "eu-west", "pool": "east-h100"}, "validation_failed",
         "node pool 'east-h100' is in region 'us-east', not 'eu-west'"),
    ],
)  # fmt: skip
async def test_what_cannot_hold_is_refused_and_changes_nothing(
    base: Api, path: str, body: dict[str, Any], code: str, says: str
) -> None:
    assert (await base.client.post("/v1/node-pools", json=POOL)).status_code == 201
    before = await base.revision()
    name = body["name"] if path.endswith("nodes") else "other"
    refused = await base.client.post(path, json={**body, "name": name})
    assert refused.status_code == 422, refused.text
    assert refused.json()["code"] == code, refused.json()
    assert says in refused.text, refused.json()
    assert (await base.client.get(f"{path}/{name}")).status_code == 404
    assert await base.revision() == before
