"""Declarative apply, and the rule that every committed change bumps the revision once."""

from __future__ import annotations

from typing import Any

import yaml

from tests.kits.controlplane import Api
from tests.kits.fleet_docs import EXAMPLE, example


async def _apply(api: Api, document: object, **params: str) -> dict[str, object]:
    response = await api.client.post("/v1/apply", json=document, params=params)
    assert response.status_code == 200, response.text
    result: dict[str, object] = response.json()
    return result


async def test_example_applies_then_changes_nothing(api: Api) -> None:
    yaml_body = EXAMPLE.read_bytes()
    first = await api.client.post(
        "/v1/apply", content=yaml_body, headers={"Content-Type": "application/yaml"}
    )
    assert first.status_code == 200, first.text
    assert first.json()["changed"] is True
    assert first.json()["revision"] == 1
    regions = (await api.client.get("/v1/regions")).json()["items"]
    assert {r["name"]: r["jurisdiction"] for r in regions} == {
        "us-east": "us",
        "us-west": "us",
        "eu-west": "eu",
    }
    assert len({r["cloud"] for r in regions}) == 2

    second = await api.client.post(
        "/v1/apply", content=yaml_body, headers={"Content-Type": "application/yaml"}
    )
    assert second.json() == {"dry_run": False, "changed": False, "changes": [], "revision": 1}
    assert await api.revision() == 1


async def test_dry_run_shows_the_diff_and_changes_nothing(api: Api) -> None:
    await _apply(api, example())
    changed = example()
    changed["regions"][0]["state"] = "draining"
    changed["tenants"] = [t for t in changed["tenants"] if t["name"] != "eurobank"]
    preview = await _apply(api, changed, dry_run="true")
    assert preview["changes"] == [
        {
            "action": "update",
            "kind": "region",
            "name": "us-east",
            "changes": {"state": ["active", "draining"]},
        },
        {
            "action": "delete",
            "kind": "tenant",
            "name": "eurobank",
            "before": {
                "tier": "premium",
                "allowed_jurisdictions": ["eu"],
                "requests_per_minute": 1200,
                "tokens_per_minute": 500000,
                "debug_routes": False,
                "disabled": False,
                "tiering": False,
                "tier_floor": None,
                "max_concurrency": 256,
                "weight": 1.0,
                "default_class": "standard",
                "class_ceiling": "standard",
                "price_discount_percent": 0.0,
                "budgets": [],
            },
        },
    ]
    assert preview["revision"] == 1
    assert await api.revision() == 1
    assert (await api.client.get("/v1/tenants/eurobank")).status_code == 200

    applied = await _apply(api, changed)
    assert applied["revision"] == 2
    assert (await api.client.get("/v1/tenants/eurobank")).status_code == 404
    events = (await api.client.get("/v1/audit-events", params={"limit": 5})).json()["items"]
    assert [(e["revision"], e["action"], e["name"]) for e in events[:2]] == [
        (2, "delete", "eurobank"),
        (2, "update", "us-east"),
    ]
    assert events[1]["before"]["state"] == "active"
    assert events[1]["after"]["state"] == "draining"
    assert events[1]["principal"] == "bootstrap-admin"


async def test_kinds_left_out_are_left_alone(api: Api) -> None:
    await _apply(api, example())
    result = await _apply(api, {"clouds": example()["clouds"]})
    assert result["changed"] is False
    assert len((await api.client.get("/v1/deployments")).json()["items"]) == 4


async def test_pruning_a_region_in_use_needs_cascade(api: Api) -> None:
    await _apply(api, example())
    await api.create("bootstrap-tokens", {"region": "us-west"})
    document = example()
    document["regions"] = [r for r in document["regions"] if r["name"] != "us-west"]
    document["nodes"] = [n for n in document["nodes"] if n["region"] != "us-west"]
    document["node_pools"] = [p for p in document["node_pools"] if p["region"] != "us-west"]
    document["deployments"] = [d for d in document["deployments"] if d["region"] != "us-west"]
    document["fallback_rules"] = [
        {**rule, "peers": [p for p in rule["peers"] if p != "us-west"]}
        for rule in document["fallback_rules"]
        if rule["region"] != "us-west"
    ]
    before = await api.revision()
    refused = await api.client.post("/v1/apply", json=document)
    assert refused.status_code == 409, refused.text
    assert refused.json()["dependents"] == [f"bootstrap-token {(await _token_name(api))}"]
    assert await api.revision() == before
    assert (await api.client.get("/v1/deployments/llama-us-west")).status_code == 200

    done = await _apply(api, document, cascade="true")
    assert done["revision"] == before + 1
    assert (await api.client.get("/v1/regions/us-west")).status_code == 404


async def _token_name(api: Api) -> str:
    items = (await api.client.get("/v1/bootstrap-tokens")).json()["items"]
    return str(items[0]["name"])


async def test_an_invalid_document_changes_nothing(api: Api) -> None:
    document = example()
    document["deployments"][3]["region"] = "atlantis"
    document["regions"][2]["jurisdiction"] = "EU!"
    document["surprise"] = []
    response = await api.client.post("/v1/apply", json=document)
    assert response.status_code == 422
    fields = [e["field"] for e in response.json()["errors"]]
    assert fields == ["surprise", "regions.2.jurisdiction"]

    document = example()
    document["deployments"][3]["region"] = "atlantis"
    response = await api.client.post("/v1/apply", json=document)
    assert response.status_code == 422
    assert response.json()["code"] == "unknown_reference"
    assert await api.revision() == 0
    assert (await api.client.get("/v1/clouds")).json()["items"] == []


async def test_unreadable_documents(api: Api) -> None:
    bad_yaml = await api.client.post(
        "/v1/apply", content=b"regions: [", headers={"Content-Type": "application/yaml"}
    )
    assert bad_yaml.status_code == 422
    assert bad_yaml.json()["code"] == "malformed_body"
    wrong_type = await api.client.post(
        "/v1/apply", content=b"x", headers={"Content-Type": "text/plain"}
    )
    assert wrong_type.status_code == 415
    not_a_mapping = await api.client.post(
        "/v1/apply", content=yaml.safe_dump([1, 2]), headers={"Content-Type": "application/yaml"}
    )
    assert not_a_mapping.status_code == 422


async def test_every_change_bumps_once_and_a_no_op_not_at_all(api: Api) -> None:
    assert await api.revision() == 0
    await api.create("clouds", {"name": "aws", "provider": "aws"})
    assert await api.revision() == 1
    same = await api.client.patch(
        "/v1/clouds/aws", json={"provider": "aws"}, headers={"If-Match": '"1"'}
    )
    assert same.status_code == 200
    assert same.json()["version"] == 1
    assert "x-meridian-revision" not in same.headers
    assert await api.revision() == 1
    changed = await api.client.patch(
        "/v1/clouds/aws", json={"description": "AWS"}, headers={"If-Match": '"1"'}
    )
    assert changed.headers["x-meridian-revision"] == "2"
    assert await api.revision() == 2
    result = await _apply(api, example())
    assert result["revision"] == 3, "a 22-object apply is one change"
    events = (await api.client.get("/v1/audit-events", params={"limit": 500})).json()["items"]
    assert {e["revision"] for e in events} == {1, 2, 3}
    declared = [e for e in events if e["revision"] == 3 and e["kind"] != "signing-key"]
    assert len(declared) == len(result["changes"])  # type: ignore[arg-type]


async def test_without_pruning_what_an_operator_added_stays(api: Api) -> None:
    """As `meridian up` applies its example again beside tenants and keys made since."""
    await _apply(api, example())
    await api.create("tenants", {"name": "extra", "tier": "standard"})
    await api.create("api-keys", {"tenant": "extra"})
    pruning = await api.client.post("/v1/apply", json=example())
    assert pruning.status_code == 409  # the tenant has a key: deleting it needs cascade
    document = example()
    document["tenants"][0]["requests_per_minute"] = 7
    kept = await _apply(api, document, prune="false")
    changes: Any = kept["changes"]
    assert [c["name"] for c in changes] == [document["tenants"][0]["name"]]
    assert (await api.client.get("/v1/tenants/extra")).status_code == 200
