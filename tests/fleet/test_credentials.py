"""Credentials that change while the fleet serves (real control plane, agents and simulated
engines): an API key rotated under steady traffic in two regions fails no request, and its
old secret is refused in both once its overlap ends; a key revoked before the control plane
went down stays refused by an agent restarted on its snapshot while it is still down."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from tests import report
from tests.kits.agents import start_agent
from tests.kits.fleet import LLAMA, OPERATOR, Fleet, fleet_of
from tests.kits.push import ADMIN, eventually

REGIONS = ("us-east", "eu-west")
OVERLAP_S = 4
SECTION = "rotations under traffic (tests/fleet/test_credentials.py)"


async def _ask(fleet: Fleet, region: str, key: str) -> int:
    async with httpx.AsyncClient(base_url=fleet.agents[region].url, timeout=30) as http:
        answer = await http.post(
            "/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": LLAMA, "messages": [{"role": "user", "content": "hi"}],
                  "max_tokens": 4},
        )  # fmt: skip
    return answer.status_code


async def _admin(fleet: Fleet, method: str, path: str, **kwargs: object) -> httpx.Response:
    async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN) as admin:
        return await admin.request(method, path, **kwargs)  # type: ignore[arg-type]


async def test_a_rotated_key_fails_no_request_and_its_old_secret_stops_in_every_region(
    database_url: str, tmp_path: Path
) -> None:
    async with fleet_of(database_url, tmp_path, REGIONS) as fleet:
        made = await _admin(fleet, "POST", "/v1/api-keys", json={"name": "app", "tenant": "acme"})
        assert made.status_code == 201, made.text
        current = {"key": made.json()["key"]}
        old = current["key"]
        for region in REGIONS:
            await eventually(lambda r=region: _served(fleet, r, old), within_s=10)
        answers: list[int] = []
        stop = asyncio.Event()

        async def client(region: str) -> None:  # uses whichever key it was last given
            while not stop.is_set():
                answers.append(await _ask(fleet, region, current["key"]))

        clients = [asyncio.ensure_future(client(r)) for r in REGIONS]
        try:
            await asyncio.sleep(1.0)
            rotated = await _admin(fleet, "POST", "/v1/api-keys/app/rotate",
                                   json={"overlap_s": OVERLAP_S})  # fmt: skip
            assert rotated.status_code == 200, rotated.text
            new = rotated.json()["key"]
            assert rotated.json()["prefix"] == made.json()["prefix"]  # the key's name stays
            # the client learns the new key when it can: the old one serves meanwhile
            await asyncio.sleep(2.0)
            current["key"] = new
            await asyncio.sleep(1.0)
        finally:
            stop.set()
            await asyncio.gather(*clients)
        bad = len(answers) - answers.count(200)
        report.add(SECTION, f"an API key rotated under traffic in {len(REGIONS)} regions: "
                   f"{len(answers)} requests, {bad} failed")  # fmt: skip
        assert bad == 0
        assert len(answers) > 20
        # the old secret is refused in every region once its overlap has passed
        for region in REGIONS:
            await eventually(lambda r=region: _refused(fleet, r, old), within_s=OVERLAP_S + 3)
            assert await _ask(fleet, region, new) == 200
        audit = (await _admin(fleet, "GET", "/v1/audit-events", params={"kind": "api-key"})).json()
        assert any(e["name"] == "app" and e["action"] == "update" for e in audit["items"])


async def _served(fleet: Fleet, region: str, key: str) -> bool:
    return await _ask(fleet, region, key) == 200


async def _refused(fleet: Fleet, region: str, key: str) -> bool:
    return await _ask(fleet, region, key) == 401


async def test_a_key_revoked_before_an_outage_stays_refused_by_an_agent_restarted_on_its_disk(
    database_url: str, tmp_path: Path
) -> None:
    region = REGIONS[0]
    async with fleet_of(database_url, tmp_path, (region,)) as fleet:
        made = await _admin(fleet, "POST", "/v1/api-keys", json={"name": "leak", "tenant": "acme"})
        assert made.status_code == 201, made.text
        leaked = made.json()["key"]
        await eventually(lambda: _served(fleet, region, leaked), within_s=10)
        revoked = await _admin(fleet, "PATCH", "/v1/api-keys/leak", json={"revoked": True},
                               headers={"If-Match": f'"{made.json()["version"]}"'})  # fmt: skip
        assert revoked.status_code == 200, revoked.text
        await eventually(lambda: _refused(fleet, region, leaked), within_s=2)
        await fleet.kill_control_plane()
        agent = fleet.agents[region]
        os.kill(agent.process.pid, signal.SIGKILL)
        await agent.process.wait()
        fleet.agents[region] = await start_agent(
            fleet.cp.grpc_target, region, tmp_path / region, node=f"{region}-1",
            operator=OPERATOR, port=urlsplit(agent.url).port,
            env={"MERIDIAN_AGENT_CONTROL_PLANE_URL": fleet.cp.url},
        )  # fmt: skip

        async def serving() -> bool:
            return await _served(fleet, region, fleet.keys["acme"])

        await eventually(serving, within_s=40)  # its engines again, from its disk
        assert await _ask(fleet, region, leaked) == 401


async def test_a_signing_key_rotates_under_steady_escalation_and_no_escalation_fails(
    database_url: str, tmp_path: Path
) -> None:
    """us-east's engines fail every request: each is escalated to us-west, signed with
    us-east's key. Its key is rotated meanwhile: us-west accepts the new key before us-east
    signs with it, and the old one until what it signed has expired."""
    async with fleet_of(database_url, tmp_path, ("us-east", "us-west")) as fleet:
        await fleet.fail_engines("us-east")
        key = fleet.keys["acme"]
        served: list[str | None] = []
        failed: list[str | None] = []
        stop = asyncio.Event()

        async def client() -> None:
            async with httpx.AsyncClient(base_url=fleet.agents["us-east"].url, timeout=30) as http:
                while not stop.is_set():
                    answer = await http.post(
                        "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                        json={"model": LLAMA, "messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 4},
                    )  # fmt: skip
                    ok = answer.status_code == 200
                    (served if ok else failed).append(answer.headers.get("x-meridian-region"))

        clients = [asyncio.ensure_future(client()) for _ in range(2)]
        try:
            await eventually(lambda: _escalated(fleet), within_s=10)
            rotated = await _admin(fleet, "POST", "/v1/signing-keys/rotate",
                                   json={"region": "us-east"})  # fmt: skip
            assert rotated.status_code == 200, rotated.text
            new = rotated.json()["kid"]

            async def swapped() -> int | None:  # the revision that made the new key sign
                keys = (await _admin(fleet, "GET", "/v1/signing-keys")).json()["items"]
                states = {k["kid"]: k["state"] for k in keys if k["owner"] == "us-east"}
                if states.get(new) != "signing" or "retiring" not in states.values():
                    return None
                return int((await _admin(fleet, "GET", "/v1/revision")).json()["revision"])

            revision: int = await eventually(swapped, within_s=15)

            async def holds() -> bool:
                return int((await fleet.agents["us-east"].status())["revision"] or 0) >= revision

            await eventually(holds, within_s=10)
            before = await _escalated(fleet)
            await asyncio.sleep(1.5)  # escalations signed with the new key
            after = await _escalated(fleet)
        finally:
            stop.set()
            await asyncio.gather(*clients)
    report.add(SECTION, f"a signing key rotated under steady escalation: {len(served)} "
               f"escalated requests served, {len(failed)} failed")  # fmt: skip
    assert failed == []
    assert set(served) == {"us-west"}
    assert after > before


async def _escalated(fleet: Fleet) -> int:
    return (await fleet.escalations("us-west")).get(("in", "us-east"), 0)
