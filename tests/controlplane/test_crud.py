"""Each kind can be listed, read, created, replaced, patched and deleted over HTTP."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kits.controlplane import Api
from tests.kits.fleet_docs import BASE

# kind -> (a valid create body, a merge patch that changes it, the field it changes)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "clouds": ({"name": "azure", "provider": "azure"}, {"description": "Azure"}, "description"),
    "regions": (
        {"name": "us-west", "cloud": "aws", "geography": "us-west", "jurisdiction": "us"},
        {"state": "draining"},
        "state",
    ),
    "nodes": (
        {
            "name": "n1",
            "region": "us-east",
            "hostname": "gpu-1.internal",
            "gpus": [{"index": 0, "model": "H100", "memory_gb": 80}],
        },
        {"state": "disabled"},
        "state",
    ),
    "models": (
        {"name": "qwen-32b", "source": "Qwen/Qwen2.5-32B", "context_length": 32768},
        {"context_length": 16384},
        "context_length",
    ),
    "deployments": (
        {"name": "llama-us", "model": "llama-8b", "region": "us-east", "backend": "sim"},
        {"replicas": 3},
        "replicas",
    ),
    "routing-policies": (
        {"name": "llama", "model": "llama-8b", "policy": "cost", "slo_ttft_ms": 500},
        {"policy": "round_robin"},
        "policy",
    ),
    "fallback-rules": (
        {"name": "us-out", "region": "us-east", "peers": ["eu-west"]},
        {"triggers": ["failure"]},
        "triggers",
    ),
    "tenants": (
        {"name": "globex", "tier": "premium", "allowed_jurisdictions": ["eu"]},
        {"requests_per_minute": 600},
        "requests_per_minute",
    ),
    "adapters": (
        {
            "name": "acme-support",
            "base_model": "llama-8b",
            "rank": 16,
            "tenants": ["acme"],
            "source": "s3://adapters/acme-support",
            "digest": "sha256:" + "ab" * 32,
        },
        {"digest": "sha256:" + "cd" * 32},
        "digest",
    ),
    "principals": ({"name": "ci-bot", "role": "operator"}, {"role": "viewer"}, "role"),
    "api-keys": ({"name": "acme-prod", "tenant": "acme"}, {"revoked": True}, "revoked"),
}


@pytest.fixture
async def base(api: Api) -> Api:
    response = await api.client.post("/v1/apply", json=BASE)
    assert response.status_code == 200, response.text
    return api


@pytest.mark.parametrize("plural", list(CASES))
async def test_life_cycle(base: Api, plural: str) -> None:
    body, patch, field = CASES[plural]
    client = base.client
    created = await base.create(plural, body)
    assert created["name"] == body["name"]
    assert created["version"] == 1

    got = await client.get(f"/v1/{plural}/{body['name']}")
    assert got.status_code == 200
    assert got.headers["etag"] == '"1"'
    assert {k: got.json()[k] for k in body if k != "name"} == {
        k: created[k] for k in body if k != "name"
    }

    listed = (await client.get(f"/v1/{plural}")).json()
    assert body["name"] in [item["name"] for item in listed["items"]]

    patched = await client.patch(
        f"/v1/{plural}/{body['name']}", json=patch, headers={"If-Match": '"1"'}
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()[field] == patch[field]
    assert patched.headers["etag"] == '"2"'

    deleted = await client.delete(f"/v1/{plural}/{body['name']}", headers={"If-Match": '"2"'})
    assert deleted.status_code == 204, deleted.text
    assert (await client.get(f"/v1/{plural}/{body['name']}")).status_code == 404


async def test_put_replaces_the_whole_spec(base: Api) -> None:
    await base.create(
        "routing-policies", {"name": "p", "model": "llama-8b", "slo_ttft_ms": 500, "max_queue": 10}
    )
    response = await base.client.put(
        "/v1/routing-policies/p",
        headers={"If-Match": '"1"'},
        json={"model": "llama-8b", "policy": "least_load"},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["policy"] == "least_load"
    assert body["slo_ttft_ms"] is None
    assert body["max_queue"] is None


async def test_secrets_are_shown_once(base: Api) -> None:
    key = await base.create("api-keys", {"name": "k", "tenant": "acme"})
    assert key["key"].startswith(key["prefix"] + ".")
    again = (await base.client.get("/v1/api-keys/k")).json()
    assert "key" not in again
    assert again["prefix"] == key["prefix"]
    principal = await base.create("principals", {"name": "p", "role": "viewer"})
    assert "token" in principal
    assert "token" not in (await base.client.get("/v1/principals/p")).json()
    token = await base.create("bootstrap-tokens", {"region": "us-east"})
    assert token["name"].startswith("bt-")
    assert token["token"]
    listed = (await base.client.get("/v1/bootstrap-tokens")).json()["items"]
    assert [t["region"] for t in listed] == ["us-east"]
    assert "token" not in listed[0]


async def test_a_revoked_key_stays_revoked(base: Api) -> None:
    await base.create("api-keys", {"name": "k", "tenant": "acme"})
    revoke = await base.client.patch(
        "/v1/api-keys/k", json={"revoked": True}, headers={"If-Match": '"1"'}
    )
    assert revoke.json()["revoked"] is True
    assert revoke.json()["revoked_at"]
    restore = await base.client.patch(
        "/v1/api-keys/k", json={"revoked": False}, headers={"If-Match": '"2"'}
    )
    assert restore.status_code == 422
    assert restore.json()["code"] == "validation_failed"


async def test_pagination_walks_every_item_once(base: Api) -> None:
    for index in range(7):
        await base.create("clouds", {"name": f"c{index}", "provider": "onprem"})
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = (await base.client.get("/v1/clouds", params=params)).json()
        seen += [item["name"] for item in page["items"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == sorted(["aws", "gcp", *[f"c{i}" for i in range(7)]])


async def test_unknown_name_is_404_problem(base: Api) -> None:
    response = await base.client.get("/v1/regions/atlantis")
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == "not_found"


async def test_policy_parameters_are_checked_against_the_policy_before_commit(base: Api) -> None:
    """A parameter the policy does not take, or out of its range, is refused with 422 when
    written, not committed and then refused by every agent that receives the snapshot."""
    await base.create(
        "routing-policies",
        {"name": "p", "model": "llama-8b", "policy": "cost", "params": {"price_answers": True}},
    )
    revision = await base.revision()
    # a merge patch keeps the params: round_robin takes no price_answers
    response = await base.client.patch(
        "/v1/routing-policies/p", headers={"If-Match": "*"}, json={"policy": "round_robin"}
    )
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert "price_answers" in response.text
    response = await base.client.patch(
        "/v1/routing-policies/p", headers={"If-Match": "*"}, json={"params": {"miss_weight": -1}}
    )
    assert response.status_code == 422, response.text
    assert "miss_weight" in response.text
    kept = (await base.client.get("/v1/routing-policies/p")).json()
    assert kept["policy"] == "cost"
    assert kept["params"] == {"price_answers": True}
    assert await base.revision() == revision


async def test_true_or_false_is_not_a_number(base: Api) -> None:
    """Found by the fuzzer: pydantic takes `true` for 1, so a model was created with a context
    of one token. A number field refuses it, and nothing is written."""
    revision = await base.revision()
    response = await base.client.post("/v1/models", json={
        "name": "tiny", "source": "org/tiny", "context_length": True,
        "capabilities": ["chat"], "min_gpu_memory_gb": 1})  # fmt: skip
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert "context_length" in response.text
    assert (await base.client.get("/v1/models/tiny")).status_code == 404
    assert await base.revision() == revision
