"""No secret in clear at rest: a fleet with regions (their signing keys), the control plane's
key, a tenant's API key, a principal's token and a bootstrap token, dumped with pg_dump: no
token and no private key is in the dump, in any encoding it could take there, while their
public parts are (the search finds what is there)."""

from __future__ import annotations

import asyncio
import base64

from controlplane.db.embedded import find_bin_dir
from controlplane.services.sealing.keyring import Keyring
from controlplane.services.sealing.signing import open_seeds
from controlplane.snapshot.keys import public_key
from tests.controlplane.sealing.kit import example_fleet
from tests.kits.controlplane import ADMIN_TOKEN, Api


async def _dump(database_url: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        str(find_bin_dir() / "pg_dump"), "--no-owner", database_url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


def _spellings(secret: bytes) -> set[str]:
    """How 32 bytes could appear in a dump: hex (bytea), base64 (text, JSON), urlsafe."""
    return {secret.hex(), base64.b64encode(secret).decode().rstrip("="),
            base64.urlsafe_b64encode(secret).decode().rstrip("=")}  # fmt: skip


async def test_a_database_dump_holds_no_token_and_no_private_key(
    api: Api, database_url: str
) -> None:
    _, sealer = await example_fleet(api, database_url)
    await Keyring(api.db, sealer).ensure()  # the control plane's own key, as a replica's start
    tokens = [
        (await api.client.post("/v1/api-keys", json={"tenant": "acme"})).json()["key"],
        (await api.client.post("/v1/principals", json={"name": "ops", "role": "operator"})).json()[
            "token"
        ],
        (await api.client.post("/v1/bootstrap-tokens", json={"region": "us-east"})).json()["token"],
        ADMIN_TOKEN,
    ]
    keys = (await api.client.get("/v1/signing-keys")).json()["items"]
    assert {k["owner"] for k in keys} == {"us-east", "us-west", "eu-west", "@control-plane"}
    async with api.db.sessions() as session:
        seeds = await open_seeds(session, sealer, [k["kid"] for k in keys])
    assert len(seeds) == len(keys)
    dump = await _dump(database_url)
    for token in tokens:
        assert token not in dump
        assert token.rpartition(".")[2] not in dump  # nor its secret part alone
    for kid, seed in seeds.items():
        assert not any(s in dump for s in _spellings(seed)), f"key {kid}'s seed is in the dump"
        assert kid in dump  # what is public is there: the search would find a seed
        assert base64.b64decode(public_key(base64.b64encode(seed).decode())[1]).hex() in dump
