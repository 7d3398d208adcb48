"""The capacity planner on a real fleet (issue 42): a control plane on PostgreSQL whose leader
plans every second, agents with simulated engines, all real processes. Demand rising in a
region grows its engines while no request fails; demand moving from one region to another
moves them; demand falling shrinks them, by halves after
a cool-down, while streams run on to their end; every change is audited with its reason, and
`meridian planner plan` shows it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam

from tests.kits.controlplane import ADMIN_TOKEN, run_cli
from tests.kits.fleet import LLAMA, Fleet, fleet_of
from tests.kits.push import ADMIN, eventually

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello to the planner."}]
PLANNER = {
    "planner_period_s": "1",
    "planner_cooldown_s": "3",
    "planner_start_s": "2",
    "planner_engine_rps": "3",
}


def _autoscaled(doc: dict[str, Any]) -> None:
    for d in doc["deployments"]:
        if d["region"] == "us-east":
            d["autoscale"] = {"min_replicas": 1, "max_replicas": 3, "headroom": 0}


async def _engines(fleet: Fleet, region: str = "us-east") -> int:
    status = await fleet.status(region)
    return sum(1 for e in status["engines"]
               if e["state"] == "ready" and e["id"].startswith(f"llama-{region}/"))  # fmt: skip


async def _until(fleet: Fleet, done: Callable[[], Awaitable[bool]], within_s: float) -> None:
    """`eventually`, and what the planner last decided when it does not come."""
    try:
        await eventually(done, within_s=within_s)
    except TimeoutError:
        async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN) as http:
            shown = (await http.get("/v1/planner")).json()
        engines = (await fleet.status("us-east"))["engines"]
        raise AssertionError(f"engines: {engines}; the planner: {shown}") from None


class Load:
    """Senders asking without pause until stopped; what they got, and what failed."""

    def __init__(self, client: openai.AsyncOpenAI, senders: int, max_tokens: int, stream: bool):
        self.stop = asyncio.Event()
        self.done: list[str] = []  # how each answer finished
        self.failed: list[BaseException] = []
        self.task = asyncio.gather(*(self._send(client, max_tokens, stream)
                                     for _ in range(senders)))  # fmt: skip

    async def _send(self, client: openai.AsyncOpenAI, max_tokens: int, stream: bool) -> None:
        while not self.stop.is_set():
            try:
                if stream:
                    chunks = await client.chat.completions.create(
                        model=LLAMA, messages=HELLO, max_tokens=max_tokens, stream=True
                    )
                    finished = [c.choices[0].finish_reason async for c in chunks if c.choices]
                    self.done.append(next((f for f in finished if f), "cut"))
                else:
                    answer = await client.chat.completions.create(
                        model=LLAMA, messages=HELLO, max_tokens=max_tokens
                    )
                    self.done.append(answer.choices[0].finish_reason)
            except openai.APIError as error:
                self.failed.append(error)

    async def ended(self) -> None:
        self.stop.set()
        await self.task


async def test_engines_follow_demand_up_and_down_and_no_request_fails(
    database_url: str, tmp_path: Path
) -> None:
    async with fleet_of(
        database_url, tmp_path, ("us-east", "us-west"), _autoscaled, cp_env=PLANNER
    ) as fleet:
        client = fleet.client("us-east").with_options(timeout=30)
        heavy = Load(client, senders=12, max_tokens=24, stream=False)

        async def grown() -> bool:
            return await _engines(fleet) == 3

        await _until(fleet, grown, within_s=30)
        streams = Load(client, senders=2, max_tokens=400, stream=True)
        await heavy.ended()

        async def shrunk() -> bool:
            return await _engines(fleet) == 1

        await _until(fleet, shrunk, within_s=40)
        await streams.ended()
        env = {"MERIDIAN_URL": fleet.cp.url, "MERIDIAN_TOKEN": ADMIN_TOKEN}
        code, shown = await run_cli("planner", "plan", env=env)
        async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN) as http:
            events = (await http.get("/v1/audit-events", params={"kind": "engine-plan"})).json()
            metrics = (await http.get("/metrics")).text
            panel = (await http.get("/v1/status")).json()["planner"]
        await client.close()
    assert heavy.failed == []
    assert streams.failed == []
    assert len(heavy.done) > 50
    assert streams.done
    assert set(streams.done) == {"length"}
    changes = [(e["before"]["engines"], e["after"]["engines"]) for e in reversed(events["items"])]
    assert changes[0][0] == 1
    assert max(after for _, after in changes) == 3
    assert changes[-1] == (2, 1)  # down by half at most: 3, then 2, then 1
    assert all(e["principal"] == "planner" and "us-east llama-3.1-8b-instruct" in
               e["after"]["reason"] for e in events["items"])  # fmt: skip
    assert 'meridian_planner_changes_total{direction="up",taken="true"}' in metrics
    assert 'meridian_planner_changes_total{direction="down",taken="true"}' in metrics
    (row,) = panel["decisions"]  # the status page's panel: its last period, 2→1 or 1 held
    assert (row["deployment"], row["target"]) == ("llama-us-east", 1)
    assert row["cost_per_hour"] == 3.9  # one engine of one GPU, at us-east's pool's price
    assert code == 0, shown
    assert "llama-us-east" in shown
    assert "mode act, running" in shown


def _both_autoscaled(doc: dict[str, Any]) -> None:
    """llama sized by the planner in us-east (up to 3 engines) and eu-west (its node has 2
    GPUs); us-east's overload escalates to eu-west (acme's requests may go anywhere)."""
    for d in doc["deployments"]:
        d["replicas"] = 1
        d["autoscale"] = {"min_replicas": 1, "max_replicas": 3 if d["region"] == "us-east" else 2,
                          "headroom": 0}  # fmt: skip


async def test_engines_move_with_demand_from_us_east_to_eu_west(
    database_url: str, tmp_path: Path
) -> None:
    async with fleet_of(
        database_url, tmp_path, ("us-east", "eu-west"), _both_autoscaled, cp_env=PLANNER
    ) as fleet:
        east = fleet.client("us-east").with_options(timeout=30)
        west = fleet.client("eu-west").with_options(timeout=30)
        load = Load(east, senders=12, max_tokens=24, stream=False)

        async def east_grown() -> bool:
            return await _engines(fleet, "us-east") == 3

        await _until(fleet, east_grown, within_s=30)
        await load.ended()
        moved = Load(west, senders=8, max_tokens=24, stream=False)

        async def followed() -> bool:
            return (await _engines(fleet, "eu-west"), await _engines(fleet, "us-east")) == (2, 1)

        await _until(fleet, followed, within_s=60)
        await moved.ended()
        await east.close()
        await west.close()
    assert load.failed == []
    assert moved.failed == []


def _asleep(doc: dict[str, Any]) -> None:
    """us-east's llama scales to zero, and starts there."""
    for d in doc["deployments"]:
        if d["region"] == "us-east":
            d["replicas"] = 0
            d["autoscale"] = {"min_replicas": 0, "max_replicas": 2, "scale_to_zero": True}


def _asleep_alone(doc: dict[str, Any]) -> None:
    """The same, and no rule sends us-east's requests to a peer."""
    _asleep(doc)
    doc["fallback_rules"] = [r for r in doc["fallback_rules"] if r["region"] != "us-east"]


async def _served_by(client: openai.AsyncOpenAI) -> str:
    raw = await client.chat.completions.with_raw_response.create(
        model=LLAMA, messages=HELLO, max_tokens=4
    )
    raw.parse()
    return raw.headers["x-meridian-region"]


async def test_a_model_at_zero_is_served_by_a_peer_at_once_and_wakes_here(
    database_url: str, tmp_path: Path
) -> None:
    async with fleet_of(
        database_url, tmp_path, ("us-east", "us-west"), _asleep, cp_env=PLANNER
    ) as fleet:
        client = fleet.client("us-east").with_options(timeout=30)
        assert await _engines(fleet) == 0
        served = [await _served_by(client)]  # nothing runs it here: a peer, at once
        while served[-1] != "us-east" and len(served) < 200:  # demand goes on: it wakes here
            await asyncio.sleep(0.1)
            served.append(await _served_by(client))
        await client.close()
    assert served[0] == "us-west"
    assert served[-1] == "us-east"


async def test_a_model_at_zero_that_no_peer_serves_waits_for_its_engine_to_start(
    database_url: str, tmp_path: Path
) -> None:
    async with fleet_of(
        database_url, tmp_path, ("us-east",), _asleep_alone, cp_env=PLANNER
    ) as fleet:
        client = fleet.client("us-east").with_options(timeout=40)
        assert await _engines(fleet) == 0
        region = await _served_by(client)  # it waits while the planner starts an engine
        engines = await _engines(fleet)
        await client.close()
    assert region == "us-east"
    assert engines == 1
