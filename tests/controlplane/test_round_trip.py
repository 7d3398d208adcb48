"""What a GET returns can be written back, and a write is judged in RFC 9110's order: who asks,
then the precondition, then the body."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from controlplane.services.registry import KINDS
from tests.kits.controlplane import Api
from tests.kits.fleet_docs import EXAMPLE

UPDATABLE = [kind.plural for kind in KINDS if kind.updatable]


@pytest.fixture
async def fleet(api: Api) -> Api:
    applied = await api.client.post(
        "/v1/apply", content=EXAMPLE.read_text(), headers={"Content-Type": "application/yaml"}
    )
    assert applied.status_code == 200, applied.text
    await api.create("principals", {"name": "wall", "role": "viewer"})
    await api.create("api-keys", {"tenant": "acme"})
    await api.create("bootstrap-tokens", {"region": "us-east"})
    return api


async def _first(api: Api, plural: str) -> dict[str, Any]:
    items = (await api.client.get(f"/v1/{plural}")).json()["items"]
    assert items, f"the example fleet has no {plural}"
    return dict(items[0])


@pytest.mark.parametrize("plural", UPDATABLE)
async def test_a_get_put_back_as_it_is_changes_nothing(fleet: Api, plural: str) -> None:
    got = await _first(fleet, plural)
    revision = await fleet.revision()
    path = f"/v1/{plural}/{got['name']}"
    put = await fleet.client.put(path, json=got, headers={"If-Match": f'"{got["version"]}"'})
    assert put.status_code == 200, put.text
    assert put.json() == got  # nothing applied of what the server sets, nothing changed
    assert "X-Meridian-Revision" not in put.headers
    patched = await fleet.client.patch(path, json=got, headers={"If-Match": "*"})
    assert patched.status_code == 200, patched.text
    assert await fleet.revision() == revision


async def test_what_the_system_observes_is_a_read_only_status_part(fleet: Api) -> None:
    region = await _first(fleet, "regions")
    assert region["status"] == {"health": "unknown", "load": None}
    node = await _first(fleet, "nodes")
    assert node["status"]["health"] == "unknown"
    spec = (await fleet.client.get("/openapi.json")).json()["components"]["schemas"]
    assert spec["RegionReplace"]["properties"]["status"]["readOnly"] is True
    edited = {**region, "geography": "us-south", "status": {"health": "up"}}
    put = await fleet.client.put(
        f"/v1/regions/{region['name']}", json=edited, headers={"If-Match": "*"}
    )
    assert put.status_code == 200, put.text
    assert put.json()["geography"] == "us-south"
    assert put.json()["status"]["health"] == "unknown"  # not what the body said
    assert put.json()["version"] == region["version"] + 1


async def test_a_version_in_the_body_is_a_precondition_too(fleet: Api) -> None:
    model = await _first(fleet, "models")
    path = f"/v1/models/{model['name']}"
    changed = await fleet.client.put(
        path, json={**model, "context_length": 4096}, headers={"If-Match": "*"}
    )
    assert changed.status_code == 200
    stale = {**model, "context_length": 2048}  # read before that change
    refused = await fleet.client.put(path, json=stale, headers={"If-Match": "*"})
    assert refused.status_code == 412
    assert refused.json()["code"] == "version_mismatch"
    assert (await fleet.client.get(path)).json()["context_length"] == 4096  # nothing written


async def test_a_copy_of_a_get_creates_a_new_object(fleet: Api) -> None:
    model = await _first(fleet, "models")
    created = await fleet.client.post("/v1/models", json={**model, "name": "copy"})
    assert created.status_code == 201, created.text
    assert created.json()["version"] == 1


BAD = {"context_length": -1, "no_such_field": True}


async def test_preconditions_come_before_the_body(fleet: Api) -> None:
    model = await _first(fleet, "models")
    path = f"/v1/models/{model['name']}"
    body = {**model, **BAD}
    stale = await fleet.client.put(path, json=body, headers={"If-Match": '"999"'})
    assert stale.status_code == 412, stale.text
    missing = await fleet.client.put(path, json=body)
    assert missing.status_code == 428, missing.text
    assert (
        await fleet.client.patch(path, json=BAD, headers={"If-Match": '"999"'})
    ).status_code == 412
    nowhere = await fleet.client.put("/v1/models/nowhere", json=body, headers={"If-Match": "*"})
    assert nowhere.status_code == 404, nowhere.text
    valid = await fleet.client.put(path, json=body, headers={"If-Match": f'"{model["version"]}"'})
    assert valid.status_code == 422  # the body is judged once the precondition holds


async def test_who_asks_comes_before_the_precondition_and_the_body(fleet: Api) -> None:
    viewer = await fleet.client.post("/v1/principals", json={"name": "ro", "role": "viewer"})
    token = viewer.json()["token"]
    model = await _first(fleet, "models")
    path = f"/v1/models/{model['name']}"
    as_viewer = {**fleet.as_(token), "If-Match": '"999"'}
    for method in ("PUT", "PATCH"):
        answer = await fleet.client.request(method, path, json=BAD, headers=as_viewer)
        assert answer.status_code == 403, answer.text
    answer = await fleet.client.post("/v1/models", json=BAD, headers=fleet.as_(token))
    assert answer.status_code == 403
    fleet.client.headers.pop("Authorization")
    assert (await fleet.client.put(path, json=BAD)).status_code == 401


def test_the_example_fleet_has_every_updatable_kind() -> None:
    document = yaml.safe_load(EXAMPLE.read_text())
    missing = set(UPDATABLE) - {key.replace("_", "-") for key in document}
    missing -= {"principals", "api-keys", "bootstrap-tokens"}  # made by the test and the harness
    assert not missing
