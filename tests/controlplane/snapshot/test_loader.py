"""The fleet read back from PostgreSQL compiles to what the document it came from does."""

from __future__ import annotations

from controlplane.db.engine import Database
from controlplane.services.fleet_state import load_fleet_state, region_snapshots
from controlplane.snapshot import compile_region
from tests.kits.controlplane import Api
from tests.kits.fleet_docs import example, state_from


async def test_loaded_state_compiles_like_the_document(api: Api, database_url: str) -> None:
    assert (await api.client.post("/v1/apply", json=example())).status_code == 200
    key = await api.create("api-keys", {"name": "k", "tenant": "eurobank"})
    revoked = await api.create("api-keys", {"name": "old", "tenant": "eurobank"})
    await api.client.patch("/v1/api-keys/old", json={"revoked": True}, headers={"If-Match": '"1"'})
    db = Database.connect(database_url, pool_size=1)
    try:
        state = await load_fleet_state(db)
        snapshots = await region_snapshots(db)
    finally:
        await db.close()
    assert state.revision == await api.revision()
    assert [k.prefix for k in state.api_keys.values()] == [key["prefix"]]
    assert revoked["prefix"] != key["prefix"]
    expected = state_from(
        example(),
        revision=state.revision,
        api_keys=state.api_keys,
        signing_keys=state.signing_keys,
    )
    for region in ("us-east", "us-west", "eu-west"):
        assert snapshots[region] == compile_region(expected, region)
