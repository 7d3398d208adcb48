"""Input that once reached the database, or the wrong corner of HTTP, and what it gets now: a
problem with a stable code, and nothing written."""

from __future__ import annotations

import pytest

from tests.kits.controlplane import Api
from tests.kits.fleet_docs import BASE


@pytest.fixture
async def base(api: Api) -> Api:
    assert (await api.client.post("/v1/apply", json=BASE)).status_code == 200
    return api


@pytest.mark.parametrize(
    "cursor",
    ["%C2%84%C3%A7", "not a name", "x" * 64, "%00"],
)
async def test_a_cursor_that_is_not_a_name_is_refused(base: Api, cursor: str) -> None:
    answer = await base.client.get(f"/v1/tenants?cursor={cursor}")
    assert answer.status_code == 422, answer.text
    assert answer.json()["code"] == "validation_failed"


async def test_pages_follow_the_names(base: Api) -> None:
    first = (await base.client.get("/v1/regions?limit=1")).json()
    assert first["next"] == "eu-west"
    second = (await base.client.get(f"/v1/regions?limit=1&cursor={first['next']}")).json()
    assert [r["name"] for r in second["items"]] == ["us-east"]
    assert second["next"] is None
    bad = await base.client.get("/v1/audit-events?cursor=99999999999999999999")
    assert bad.status_code == 422


async def test_quotas_reach_the_documented_bound_and_no_further(base: Api) -> None:
    big = 1_000_000_000_000  # the bound the OpenAPI document states
    made = await base.client.post("/v1/tenants", json={"name": "huge", "tokens_per_minute": big})
    assert made.status_code == 201, made.text
    assert (await base.client.get("/v1/tenants/huge")).json()["tokens_per_minute"] == big
    past = await base.client.post(
        "/v1/tenants", json={"name": "past", "tokens_per_minute": big + 1}
    )
    assert past.status_code == 422


@pytest.mark.parametrize(
    "description",
    ["nul \u0000 inside", "half a pair \ud800"],
)
async def test_text_postgresql_cannot_store_is_refused(base: Api, description: str) -> None:
    revision = await base.revision()
    body = f'{{"name": "odd", "provider": "aws", "description": {_json_string(description)}}}'
    answer = await base.client.post(
        "/v1/clouds", content=body, headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 422, answer.text
    assert "cannot be stored" in answer.text
    assert await base.revision() == revision


def _json_string(value: str) -> str:
    """JSON text with every non-ASCII character escaped, lone surrogates included."""
    return '"' + "".join(c if 32 <= ord(c) < 127 else f"\\u{ord(c):04x}" for c in value) + '"'


async def test_nan_and_infinity_are_not_numbers_here(base: Api) -> None:
    body = '{"name": "nan", "model": "llama-8b", "policy": "cost", "params": {"alpha": NaN}}'
    answer = await base.client.post(
        "/v1/routing-policies", content=body, headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 422, answer.text


async def test_a_method_a_path_does_not_take_says_which_it_does(base: Api) -> None:
    answer = await base.client.request("TRACE", "/v1/regions/us-east")
    assert answer.status_code == 405
    assert answer.headers["allow"] == "DELETE, GET, PATCH, PUT"
    assert answer.json()["code"] == "method_not_allowed"
    answer = await base.client.request("DELETE", "/v1/regions")
    assert answer.headers["allow"] == "GET, POST"


async def test_a_body_that_is_not_text_is_a_malformed_body(base: Api) -> None:
    answer = await base.client.post(
        "/v1/clouds", content=b"\xff\xfe\x00", headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 422
    assert answer.json()["code"] == "malformed_body"
