"""Two writers holding the same version: one wins, the other is told it lost (412)."""

from __future__ import annotations

import asyncio

import httpx

from tests.kits.controlplane import ADMIN_TOKEN, Server

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def test_same_version_one_wins(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url, headers=AUTH) as client:
        created = await client.post("/v1/clouds", json={"name": "aws", "provider": "aws"})
        assert created.status_code == 201
        etag = created.headers["etag"]

        async def write(description: str) -> httpx.Response:
            return await client.patch(
                "/v1/clouds/aws", json={"description": description}, headers={"If-Match": etag}
            )

        for round_ in range(5):
            current = (await client.get("/v1/clouds/aws")).headers["etag"]
            etag = current
            first, second = await asyncio.gather(write(f"a{round_}"), write(f"b{round_}"))
            statuses = sorted([first.status_code, second.status_code])
            assert statuses == [200, 412], (first.text, second.text)
            winner = first if first.status_code == 200 else second
            stored = (await client.get("/v1/clouds/aws")).json()
            assert stored["description"] == winner.json()["description"]
            assert stored["version"] == int(current.strip('"')) + 1
