"""Rotation with an overlap, on a real PostgreSQL: an API key's new secret keeps its prefix
(budgets and usage name it) and both secrets reach the regions' snapshots, the old one with
the overlap's end as its expiry, never past the key's own; a principal (a service account)
rotates alike, its old token refused once the overlap ends, and its own expiry refuses it.
Bad rotations are refused and change nothing."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import yaml

from controlplane.services.fleet_state import load_fleet_state
from controlplane.services.secrets import hash_secret
from controlplane.snapshot import compile_region
from tests.kits.controlplane import Api
from tests.kits.fleet_docs import example


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_an_api_key_rotates_keeping_its_prefix_and_both_secrets_reach_the_regions(
    api: Api,
) -> None:
    applied = await api.client.post("/v1/apply", content=yaml.safe_dump(example()),
                                     headers={"Content-Type": "application/yaml"})  # fmt: skip
    assert applied.status_code == 200, applied.text
    ends = datetime.now(UTC) + timedelta(hours=1)
    made = await api.client.post(
        "/v1/api-keys", json={"name": "app", "tenant": "acme", "expires_at": ends.isoformat()}
    )
    assert made.status_code == 201, made.text
    old = made.json()["key"]
    rotated = await api.client.post("/v1/api-keys/app/rotate", json={"overlap_s": 86400})
    assert rotated.status_code == 200, rotated.text
    new, body = rotated.json()["key"], rotated.json()
    assert body["prefix"] == made.json()["prefix"]
    assert new.startswith(body["prefix"] + ".")
    assert new != old
    # a day's overlap asked for, but the key itself ends in an hour: so does its old secret
    assert datetime.fromisoformat(body["previous_expires_at"]) == ends
    assert "key" not in (await api.client.get("/v1/api-keys/app")).json()
    grants = {
        g.key_hash: g
        for t in compile_region(await load_fleet_state(api.db), "us-east").tenants
        for g in t.api_keys
    }
    assert grants[hash_secret(new)].expires_at == ends
    assert grants[hash_secret(old)].expires_at == ends
    assert grants[hash_secret(old)].prefix == body["prefix"]
    # no overlap: the old secret is gone from the snapshot at once
    again = await api.client.post("/v1/api-keys/app/rotate", json={"overlap_s": 0})
    assert again.status_code == 200, again.text
    state = compile_region(await load_fleet_state(api.db), "us-east")
    hashes = {g.key_hash for t in state.tenants for g in t.api_keys}
    assert hash_secret(again.json()["key"]) in hashes
    assert hashes.isdisjoint({hash_secret(old), hash_secret(new)})


async def test_bad_rotations_are_refused_and_change_nothing(api: Api) -> None:
    await api.client.post("/v1/tenants", json={"name": "acme"})
    made = (await api.client.post("/v1/api-keys", json={"name": "k", "tenant": "acme"})).json()
    before = (await api.client.get("/v1/revision")).json()["revision"]
    for path, body, status, code in (
        ("/v1/api-keys/k/rotate", {"overlap_s": -1}, 422, "validation_failed"),
        ("/v1/api-keys/k/rotate", {"overlap_s": 31 * 86400}, 422, "validation_failed"),
        ("/v1/api-keys/k/rotate", {"overlap_s": "1h"}, 422, "validation_failed"),
        ("/v1/api-keys/k/rotate", {"later": 1}, 422, "validation_failed"),
        ("/v1/api-keys/nobody/rotate", {}, 404, "not_found"),
        ("/v1/principals/nobody/rotate", {}, 404, "not_found"),
    ):
        answer = await api.client.post(path, json=body)
        assert answer.status_code == status, (path, body, answer.text)
        assert answer.json()["code"] == code
    assert (await api.client.get("/v1/revision")).json()["revision"] == before
    revoked = await api.client.patch("/v1/api-keys/k", json={"revoked": True},
                                     headers={"If-Match": f'"{made["version"]}"'})  # fmt: skip
    assert revoked.status_code == 200, revoked.text
    answer = await api.client.post("/v1/api-keys/k/rotate", json={})
    assert answer.status_code == 409, answer.text
    assert answer.json()["code"] == "revoked"


async def test_a_service_account_rotates_with_an_overlap_and_expires(api: Api) -> None:
    made = await api.client.post("/v1/principals", json={"name": "ci", "role": "viewer"})
    assert made.status_code == 201, made.text
    old = made.json()["token"]
    http = api.client  # its own headers, as another caller's token overrides them

    async def status_with(token: str) -> int:
        return (await http.get("/v1/revision", headers=_as(token))).status_code

    assert await status_with(old) == 200
    rotated = await api.client.post("/v1/principals/ci/rotate", json={"overlap_s": 1})
    assert rotated.status_code == 200, rotated.text
    new = rotated.json()["token"]
    assert (await status_with(old), await status_with(new)) == (200, 200)
    await asyncio.sleep(1.5)
    assert (await status_with(old), await status_with(new)) == (401, 200)
    # a service account's token that expires: good until then, refused after
    ends = datetime.now(UTC) + timedelta(seconds=1.5)
    bot = await api.client.post(
        "/v1/principals", json={"name": "bot", "role": "viewer", "expires_at": ends.isoformat()}
    )
    assert bot.status_code == 201, bot.text
    assert await status_with(bot.json()["token"]) == 200
    await asyncio.sleep(2.0)
    refused = await http.get("/v1/revision", headers=_as(bot.json()["token"]))
    assert refused.status_code == 401
    assert "expired" in refused.json()["detail"]
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    late = await api.client.post(
        "/v1/principals", json={"name": "late", "role": "viewer", "expires_at": past}
    )
    assert late.status_code == 422, late.text
