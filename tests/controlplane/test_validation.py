"""Bad input gets a clear problem with a stable code, and changes nothing."""

from __future__ import annotations

import pytest

from tests.kits.controlplane import Api
from tests.kits.fleet_docs import BASE


@pytest.fixture
async def base(api: Api) -> Api:
    assert (await api.client.post("/v1/apply", json=BASE)).status_code == 200
    return api


def _fields(body: dict[str, object]) -> list[object]:
    errors = body.get("errors")
    assert isinstance(errors, list)
    return [e["field"] for e in errors]


async def test_malformed_json_is_422(base: Api) -> None:
    response = await base.client.post(
        "/v1/clouds", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["code"] == "malformed_body"
    assert {"type", "title", "status", "detail", "code"} <= body.keys()


async def test_field_errors_name_each_field(base: Api) -> None:
    response = await base.client.post(
        "/v1/deployments",
        json={
            "name": "bad name!",
            "model": "llama-8b",
            "region": "us-east",
            "tp_size": 0,
            "surprise": 1,
        },
    )
    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "validation_failed"
    assert {"body.name", "body.tp_size", "body.surprise"} <= set(_fields(body))


async def test_inconsistent_deployment_is_refused(base: Api) -> None:
    response = await base.client.post(
        "/v1/deployments",
        json={
            "name": "d",
            "model": "llama-8b",
            "region": "us-east",
            "backend": "external",
        },
    )
    assert response.status_code == 422
    assert "external_urls" in response.json()["detail"]


async def test_unknown_reference_names_the_field(base: Api) -> None:
    before = await base.revision()
    response = await base.client.post(
        "/v1/deployments",
        json={
            "name": "d",
            "model": "llama-8b",
            "region": "atlantis",
        },
    )
    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "unknown_reference"
    assert _fields(body) == ["region"]
    assert "atlantis" in body["detail"]
    assert await base.revision() == before


async def test_duplicate_is_409(base: Api) -> None:
    response = await base.client.post("/v1/clouds", json={"name": "aws", "provider": "aws"})
    assert response.status_code == 409
    assert response.json()["code"] == "already_exists"
    await base.create("deployments", {"name": "d1", "model": "llama-8b", "region": "us-east"})
    again = await base.client.post(
        "/v1/deployments", json={"name": "d2", "model": "llama-8b", "region": "us-east"}
    )
    assert again.status_code == 409, "one deployment per model and region"


async def test_region_with_deployments_needs_cascade(base: Api) -> None:
    await base.create("deployments", {"name": "d1", "model": "llama-8b", "region": "eu-west"})
    await base.create("fallback-rules", {"name": "us", "region": "us-east", "peers": ["eu-west"]})
    refused = await base.client.delete("/v1/regions/eu-west", headers={"If-Match": '"1"'})
    assert refused.status_code == 409
    body = refused.json()
    assert body["code"] == "has_dependents"
    assert "deployment d1" in body["dependents"]
    assert (await base.client.get("/v1/deployments/d1")).status_code == 200

    done = await base.client.delete("/v1/regions/eu-west?cascade=true", headers={"If-Match": '"1"'})
    assert done.status_code == 204
    assert (await base.client.get("/v1/deployments/d1")).status_code == 404
    # the chain that named eu-west as its only peer went with it
    assert (await base.client.get("/v1/fallback-rules/us")).status_code == 404


@pytest.mark.parametrize(
    ("peers", "field"),
    [(["us-east"], "peers.0"), (["eu-west", "atlantis"], "peers.1")],
)
async def test_bad_fallback_chain_is_422(base: Api, peers: list[str], field: str) -> None:
    response = await base.client.post(
        "/v1/fallback-rules", json={"name": "r", "region": "us-east", "peers": peers}
    )
    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "invalid_fallback_chain"
    assert _fields(body) == [field]


async def test_if_match_is_required_and_checked(base: Api) -> None:
    missing = await base.client.patch("/v1/clouds/aws", json={"description": "x"})
    assert missing.status_code == 428
    assert missing.json()["code"] == "precondition_required"
    stale = await base.client.patch(
        "/v1/clouds/aws", json={"description": "x"}, headers={"If-Match": '"7"'}
    )
    assert stale.status_code == 412
    assert stale.json()["code"] == "version_mismatch"
    assert (await base.client.get("/v1/clouds/aws")).json()["description"] == ""
    gone = await base.client.delete("/v1/clouds/gcp", headers={"If-Match": '"2"'})
    assert gone.status_code == 412


async def test_a_failed_patch_changes_nothing(base: Api) -> None:
    before = await base.revision()
    response = await base.client.patch(
        "/v1/regions/us-east",
        json={"cloud": "nowhere", "state": "draining"},
        headers={"If-Match": '"1"'},
    )
    assert response.status_code == 422
    region = (await base.client.get("/v1/regions/us-east")).json()
    assert region["state"] == "active"
    assert region["version"] == 1
    assert await base.revision() == before
