"""Tenants' LoRA adapters on a running region (issue 45), real processes: a control plane, an
agent and two simulated engines started with LoRA. An adapter registered in the fleet
document is loaded on first use (a cold load, counted) and then served where it is held;
another tenant is told it does not exist; an engine killed under the adapter's traffic comes
back with it loaded again, and no request meets an engine that does not hold it."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from meridian_pb.fleet.v1.adapters import digest_of

from agents.engines.tiny_model import write_adapter
from tests.kits.fleet import LLAMA, Fleet, fleet_of
from tests.kits.push import ADMIN, eventually

ASK: Any = [{"role": "user", "content": "tell me about the sea"}]
REGION = "us-east"
# the leader's residency plan, once at its start (no engine is ready then) and not again
# within the test unless adapters are registered: adapters are loaded where requests need them
NO_PLAN = {"ADAPTER_RESIDENCY_S": "3600"}


def _lora_region(adapters: Path, replicas: dict[str, int] | None = None) -> Any:
    """`replicas`: the LoRA deployments, by name, with their engines (llama-us-east's 2)."""

    def change(doc: dict[str, Any]) -> None:
        for d in doc["deployments"]:
            if d["name"] in (replicas or {"llama-us-east": 2}):
                d["replicas"] = (replicas or {"llama-us-east": 2})[d["name"]]
                d["engine_args"] = {"enable-lora": True, "max-lora-rank": 16,
                                    "lora-target-modules": "all", "lora-load-s": 0.3}  # fmt: skip
        doc["tenants"].append({"name": "beta", "tier": "standard"})
        doc["adapters"] = []
        for name, seed in (("acme-support", 1), ("acme-legal", 2)):
            path = write_adapter(adapters / name, adapters, seed=seed, rank=4)
            doc["adapters"].append({"name": name, "base_model": LLAMA, "source": str(path),
                                    "digest": digest_of(path), "rank": 4,
                                    "tenants": ["acme"]})  # fmt: skip

    return change


async def _adapters(fleet: Fleet) -> dict[str, Any]:
    found: dict[str, Any] = (await fleet.status(REGION))["adapters"]
    return found


async def _ask(client: openai.AsyncOpenAI, model: str) -> str:
    answer = await client.chat.completions.create(model=model, messages=ASK, max_tokens=8)
    return answer.choices[0].message.content or ""


async def test_an_adapter_is_loaded_on_use_kept_where_held_and_back_after_a_kill(
    database_url: str, tmp_path: Path
) -> None:
    change = _lora_region(tmp_path / "adapters")
    async with fleet_of(database_url, tmp_path, (REGION,), change, cp_env=NO_PLAN) as fleet:
        acme = fleet.client(REGION)
        for _ in range(6):
            assert await _ask(acme, "acme-support")
        support = (await _adapters(fleet))["acme-support"]
        # loaded once, on its first use; every request after went where it was held
        assert support["cold_loads"] == 1, support
        assert support["requests"] == 6
        assert len(support["engines"]) == 1
        assert (await _adapters(fleet))["acme-legal"]["engines"] == []  # not used: not loaded
        assert await _ask(acme, f"{LLAMA}:acme-legal")  # a cold one: served on first use
        assert (await _adapters(fleet))["acme-legal"]["cold_loads"] == 1

        async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN) as http:
            made = await http.post("/v1/api-keys", json={"tenant": "beta"})
            assert made.status_code == 201, made.text
        beta = openai.AsyncOpenAI(base_url=f"{fleet.agents[REGION].url}/v1",
                                  api_key=made.json()["key"], max_retries=0)  # fmt: skip
        refusals = []
        for asked in ("acme-support", "no-such-model"):
            with pytest.raises(openai.NotFoundError) as refused:
                await _ask(beta, asked)
            refusals.append(str(refused.value).replace(asked, "X"))
            assert refused.value.code == "model_not_found"
        assert refusals[0] == refusals[1]  # word for word: its existence is not revealed

        holder = support["engines"][0]
        # killed with no traffic: the engine comes back, and its agent loads the adapter again
        # (not a cold load: no request waits for it)
        await _kill_and_see_it_back(fleet, holder)
        assert (await _adapters(fleet))["acme-support"]["cold_loads"] == 1

        failed: list[str] = []
        served = 0
        stop = asyncio.Event()

        async def traffic() -> None:
            nonlocal served
            while not stop.is_set():
                try:
                    await _ask(acme, "acme-support")
                    served += 1
                except openai.APIError as error:
                    failed.append(repr(error))

        runs = [asyncio.ensure_future(traffic()) for _ in range(3)]
        try:
            await asyncio.sleep(0.5)
            await _kill_and_see_it_back(fleet, holder)
            await asyncio.sleep(1)
        finally:
            stop.set()
            await asyncio.gather(*runs)
        assert failed == []  # none met an engine without it ("never loaded")
        assert served > 10

        # registered now: the leader plans it at once, not a period (an hour here) later,
        # and it is loaded before any request asks for it
        path = write_adapter(tmp_path / "adapters" / "acme-new", tmp_path / "adapters", seed=3,
                             rank=4)  # fmt: skip
        async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN) as http:
            made = await http.post("/v1/adapters", json={
                "name": "acme-new", "base_model": LLAMA, "source": str(path),
                "digest": digest_of(path), "rank": 4, "tenants": ["acme"]})  # fmt: skip
            assert made.status_code == 201, made.text

        async def warm() -> bool:
            new = (await _adapters(fleet)).get("acme-new")
            return new is not None and len(new["engines"]) == 1 and new["planned"] == new["engines"]

        await eventually(warm, within_s=30, every_s=0.2)
        assert (await _adapters(fleet))["acme-new"]["cold_loads"] == 0


async def _kill_and_see_it_back(fleet: Fleet, engine: str) -> None:
    pid = {e["id"]: e for e in (await fleet.status(REGION))["engines"]}[engine]["pid"]
    os.kill(pid, signal.SIGKILL)

    async def held_again() -> bool:
        status = await fleet.status(REGION)
        back = {e["id"]: e for e in status["engines"]}[engine]
        return (
            back["state"] == "ready" and back["pid"] not in (None, pid)
            and engine in status["adapters"]["acme-support"]["engines"]
        )  # fmt: skip

    await eventually(held_again, within_s=30, every_s=0.1)


async def test_the_leader_keeps_adapters_loaded_before_their_first_request_and_hot_ones_wider(
    database_url: str, tmp_path: Path
) -> None:
    """Registered, each adapter is loaded on one engine of the region before any request
    (there is room for both); steady demand for one then has the leader plan it onto both
    engines (its share of them, twice over), loaded there without a request waiting; the
    status page's document shows where each is held."""
    change = _lora_region(tmp_path / "adapters")
    env = {"ADAPTER_RESIDENCY_S": "1"}
    async with fleet_of(database_url, tmp_path, (REGION,), change, cp_env=env) as fleet:

        async def held(name: str, engines: int) -> bool:
            return len((await _adapters(fleet))[name]["engines"]) == engines

        await eventually(lambda: held("acme-legal", 1), within_s=30, every_s=0.2)
        await eventually(lambda: held("acme-support", 1), within_s=30, every_s=0.2)
        acme = fleet.client(REGION)
        stop = asyncio.Event()

        async def traffic() -> None:
            while not stop.is_set():
                await _ask(acme, "acme-support")

        async def wide() -> bool:  # planned onto both, and loaded where planned
            support = (await _adapters(fleet))["acme-support"]
            return len(support["engines"]) == 2 and sorted(support["planned"]) == support["engines"]

        run = asyncio.ensure_future(traffic())
        try:
            await eventually(wide, within_s=30, every_s=0.2)
        finally:
            stop.set()
            await run
        # no request waited for a load: all were planned (the plan shrinks only once demand
        # has stayed down for several periods: this read comes before)
        support = (await _adapters(fleet))["acme-support"]
        assert support["cold_loads"] == 0
        async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN) as http:

            async def shown() -> Any:  # the heartbeats after the traffic's end, counted
                status = (await http.get("/v1/status")).json()
                rows = [a for a in status["adapters"] if a["adapter"] == "acme-support"]
                return (rows and len(rows[0]["engines"]) == 2
                        and rows[0]["requests"] >= support["requests"] - 5 and rows[0])  # fmt: skip

            row = await eventually(shown, within_s=15)
            audit = (await http.get("/v1/audit-events", params={"kind": "adapter-plan"})).json()
        assert row["region"] == REGION
        assert row["cold_loads"] == 0
        assert row["requests"] >= support["requests"] - 5
        planned = [e for e in audit["items"] if e["name"] == "acme-support"]
        assert [e["after"]["engines"] for e in planned][:2] == [2, 1]  # newest first


async def test_an_adapter_request_escalates_to_a_peer_that_loads_it(
    database_url: str, tmp_path: Path
) -> None:
    """us-east's engines fail every request: an adapter's request escalates to us-west (its
    fallback rule's peer, which serves the base model and may serve acme), which loads the
    adapter on first use and answers it."""
    change = _lora_region(tmp_path / "adapters", {"llama-us-east": 1, "llama-us-west": 1})
    regions = (REGION, "us-west")
    async with fleet_of(database_url, tmp_path, regions, change, cp_env=NO_PLAN) as fleet:
        await fleet.fail_engines(REGION, error_rate=1.0)
        acme = fleet.client(REGION)
        for _ in range(3):
            assert await _ask(acme, "acme-support")
        west = (await fleet.status("us-west"))["adapters"]["acme-support"]
        assert west["requests"] == 3  # each escalated there, and served
        assert west["cold_loads"] == 1
        assert len(west["engines"]) == 1
        assert (await fleet.escalations(REGION)).get(("out", "us-west"), 0) >= 3


WAVES = {"name": "default", "canary": "node", "waves": [{"count": 1}, {"percent": 100}],
         "bake_s": 3, "checks": {"min_requests": 10, "wait_for_traffic_s": 60}}  # fmt: skip


async def _versions(fleet: Fleet, region: str) -> set[str]:
    """The digests (their first 32 hex digits, as the agent's cache names a version) of the
    acme-support the region's engines hold, as the engines themselves list it."""
    found = set()
    async with httpx.AsyncClient(timeout=5) as http:
        for engine in (await fleet.status(region))["engines"]:
            models = (await http.get(f"{engine['url']}/v1/models")).json()["data"]
            found |= {Path(m["root"]).name for m in models if m["id"] == "acme-support"}
    return found


async def test_a_new_version_reaches_the_canary_first_and_leaves_it_when_aborted(
    waved_database_url: str, tmp_path: Path
) -> None:
    """A new version of an adapter (its source and digest) is an intent change: it rolls out
    in waves, so the canary region's engines hold it while the other's still hold the old
    one; the rollout aborted, the canary's engines hold the old one again."""
    adapters = tmp_path / "adapters"
    lora = _lora_region(adapters, {"llama-us-east": 1, "llama-us-west": 1})

    def change(doc: dict[str, Any]) -> None:
        lora(doc)
        doc["rollout_policies"] = [WAVES]

    new = write_adapter(adapters / "acme-support-v2", adapters, seed=9, rank=4)
    regions = (REGION, "us-west")
    env = {"ADAPTER_RESIDENCY_S": "1"}
    async with fleet_of(waved_database_url, tmp_path, regions, change, cp_env=env) as fleet:
        old, fresh = digest_of(adapters / "acme-support")[7:39], digest_of(new)[7:39]
        for region in regions:  # kept warm once registered
            await eventually(lambda r=region: _held_as(fleet, r, {old}), within_s=30)
        async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN, timeout=30) as http:
            changed = await http.patch(
                "/v1/adapters/acme-support", json={"source": str(new), "digest": digest_of(new)},
                headers={"If-Match": "*"},
            )  # fmt: skip
            assert changed.status_code == 200, changed.text

            async def canary() -> str | None:
                held = {r: await _versions(fleet, r) for r in regions}
                first = [r for r, v in held.items() if v == {fresh}]
                return first[0] if len(first) == 1 else None

            first = await eventually(canary, within_s=30)
            rest = next(r for r in regions if r != first)
            assert await _versions(fleet, rest) == {old}  # not yet its wave
            aborted = await http.post("/v1/rollouts/current/abort")
            assert aborted.status_code == 200, aborted.text
        await eventually(lambda: _held_as(fleet, first, {old}), within_s=30)
        assert await _versions(fleet, rest) == {old}


async def _held_as(fleet: Fleet, region: str, versions: set[str]) -> bool:
    return await _versions(fleet, region) == versions
