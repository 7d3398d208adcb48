"""A signing key's rotation, step by step, on a real PostgreSQL: published to every region
while the old key signs; signing once every agent that is up holds that revision (the old one
then retiring, still accepted); dropped once every agent holds the swap and an assertion's
lifetime has passed. `immediate` drops the old one at once. Bad requests change nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from controlplane.services.fleet_state import load_fleet_state
from controlplane.services.sealing.keyring import Keyring
from controlplane.services.sealing.sealer import Sealer
from controlplane.services.sealing.signing import Seeds
from controlplane.snapshot import compile_region
from tests.controlplane.sealing.kit import example_fleet
from tests.kits.controlplane import Api
from tests.kits.services import sql


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


async def _views(api: Api, sealer: Sealer) -> tuple[str | None, set[str]]:
    """The key us-east signs with, and those eu-west accepts from it (as pushed)."""
    state = await load_fleet_state(api.db)
    async with api.db.sessions() as session:
        state = await Seeds(sealer).fill(session, state)
    east, eu = compile_region(state, "us-east"), compile_region(state, "eu-west")
    signs = east.signing_key.key_id if east.signing_key is not None else None
    (trusted,) = [t for t in eu.trusted if t.region == "us-east"]
    return signs, set(trusted.public_keys)


async def _agents_hold(database_url: str, revision: int) -> None:
    statement = f"UPDATE nodes SET health = 'up', applied_revision = {int(revision)}"  # noqa: S608
    await sql(database_url, statement)


async def test_a_key_is_published_then_signs_then_the_old_one_is_dropped(
    api: Api, database_url: str
) -> None:
    revision, sealer = await example_fleet(api, database_url)
    await _agents_hold(database_url, revision)
    clock = Clock()
    keyring = Keyring(api.db, sealer, clock=clock)
    old, accepted = await _views(api, sealer)
    assert old is not None
    assert accepted == {old}

    rotated = await api.client.post("/v1/signing-keys/rotate", json={"region": "us-east"})
    assert rotated.status_code == 200, rotated.text
    new = rotated.json()["kid"]
    assert rotated.json()["state"] == "published"
    assert await _views(api, sealer) == (old, {old, new})  # everywhere before it signs
    assert await keyring.tick() == []  # the agents do not hold it yet: nothing moves

    await _agents_hold(database_url, rotated.json()["revision"])
    steps = {(s.kid, s.done) for s in await keyring.tick()}
    assert steps == {(new, "signing"), (old, "retiring")}
    assert await _views(api, sealer) == (new, {old, new})  # the old one is still accepted
    clock.now += timedelta(minutes=5)
    assert await keyring.tick() == []  # the agents hold no swap yet: its wait has not begun
    await _agents_hold(database_url, (await api.client.get("/v1/revision")).json()["revision"])
    assert await keyring.tick() == []  # begun: an assertion's lifetime, and a margin
    clock.now += timedelta(seconds=39)
    assert await keyring.tick() == []
    clock.now += timedelta(seconds=2)
    assert [(s.kid, s.done) for s in await keyring.tick()] == [(old, "dropped")]
    assert await _views(api, sealer) == (new, {new})
    audit = (await api.client.get("/v1/audit-events", params={"kind": "signing-key"})).json()
    assert {(e["name"], e["action"]) for e in audit["items"]} >= {
        (new, "create"),
        (new, "update"),
        (old, "update"),
        (old, "delete"),
    }


async def test_an_immediate_rotation_drops_the_old_key_at_once_and_bad_requests_change_nothing(
    api: Api, database_url: str
) -> None:
    _, sealer = await example_fleet(api, database_url)
    old, _ = await _views(api, sealer)
    before = (await api.client.get("/v1/revision")).json()["revision"]
    for body, status in (
        ({"region": "nowhere"}, 404),
        ({}, 422),
        ({"region": "us-east", "control_plane": True}, 422),
        ({"region": "us-east", "immediate": "yes"}, 422),
    ):
        answer = await api.client.post("/v1/signing-keys/rotate", json=body)
        assert answer.status_code == status, (body, answer.text)
        assert answer.headers["content-type"] == "application/problem+json"
    assert (await api.client.get("/v1/revision")).json()["revision"] == before
    answer = await api.client.post(
        "/v1/signing-keys/rotate", json={"region": "us-east", "immediate": True}
    )
    assert answer.status_code == 200, answer.text
    new = answer.json()["kid"]
    assert answer.json()["state"] == "signing"
    assert await _views(api, sealer) == (new, {new})
    assert old != new
