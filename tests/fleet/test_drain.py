"""Engines that a snapshot stops on purpose drain first: a change of engine arguments rolls
through a deployment one engine at a time and a scale-down from 4 to 1 lets the leaving
engines finish what they run, both under steady traffic, with no failed request; an engine
whose drain deadline passes has its streams carried on by another. Real processes: a control
plane, an agent, simulated engines."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import openai

from tests.kits.fleet import LLAMA, Fleet, fleet_of
from tests.kits.push import eventually, patch

DEPLOYMENT = "/v1/deployments/llama-us-east"
ASK: Any = {"role": "user", "content": "tell me about the sea"}


def _four_slow(doc: dict[str, Any]) -> None:
    for d in doc["deployments"]:
        if d["name"] == "llama-us-east":
            d["replicas"], d["engine_args"] = 4, {"slow-factor": 3}


class Traffic:
    """Streams, a few at a time, until stopped; each checked whole."""

    def __init__(self, client: openai.AsyncOpenAI, tokens: int, concurrency: int) -> None:
        self.client, self.tokens = client, tokens
        self.served, self.failed = 0, []  # type: ignore[var-annotated]
        self._stop = asyncio.Event()
        self._tasks = [asyncio.ensure_future(self._loop()) for _ in range(concurrency)]

    async def _loop(self) -> None:
        while not self._stop.is_set():
            await self.one()

    async def one(self) -> None:
        try:
            stream = await self.client.chat.completions.create(
                model=LLAMA, messages=[ASK], max_tokens=self.tokens, stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            chunks = [chunk async for chunk in stream]
            usage = chunks[-1].usage
            assert usage is not None, "no usage: the stream did not end whole"
            assert usage.completion_tokens == self.tokens, usage
            self.served += 1
        except (openai.APIError, AssertionError) as error:
            self.failed.append(repr(error))

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


async def _engines(fleet: Fleet) -> list[dict[str, Any]]:
    engines: list[dict[str, Any]] = (await fleet.status("us-east"))["engines"]
    return engines


async def test_an_argument_change_and_a_scale_down_under_load_fail_no_request(
    database_url: str, tmp_path: Path
) -> None:
    async with fleet_of(database_url, tmp_path, ("us-east",), _four_slow) as fleet:
        traffic = Traffic(fleet.client("us-east"), tokens=24, concurrency=6)
        seen_draining: list[int] = []  # what a draining engine had left, each time one showed

        async def settled(count: int, pids: set[int]) -> bool:
            engines = await _engines(fleet)
            seen_draining.extend(
                e["running_requests"] for e in engines if e["state"] == "draining"
            )  # fmt: skip
            return len(engines) == count and all(
                e["state"] == "ready" and e["pid"] not in pids for e in engines
            )

        try:
            await eventually(lambda: asyncio.sleep(1, result=True), within_s=5)  # traffic flows
            old = {e["pid"] for e in await _engines(fleet)}
            await patch(fleet.cp.url, DEPLOYMENT, {"engine_args": {"slow-factor": 2}})
            await eventually(lambda: settled(4, old), within_s=90, every_s=0.1)
            rolled = {e["pid"] for e in await _engines(fleet)}
            await patch(fleet.cp.url, DEPLOYMENT, {"replicas": 1})
            await eventually(lambda: settled(1, set()), within_s=90, every_s=0.1)
            assert (await _engines(fleet))[0]["pid"] in rolled
        finally:
            await traffic.stop()
        status = await fleet.status("us-east")
    assert traffic.failed == []
    assert traffic.served > 20
    assert any(left > 0 for left in seen_draining)  # engines drained with requests running
    assert [m for m in status["migrations"] if m["why"] == "drained"] == []  # all finished there


def _two_that_drain_fast(doc: dict[str, Any]) -> None:
    for d in doc["deployments"]:
        if d["name"] == "llama-us-east":
            d["replicas"], d["engine_args"] = 2, {"slow-factor": 3}
            d["drain_timeout_s"] = 1


async def test_streams_past_the_drain_deadline_are_carried_on_and_the_engine_stops(
    database_url: str, tmp_path: Path
) -> None:
    async with fleet_of(database_url, tmp_path, ("us-east",), _two_that_drain_fast) as fleet:
        traffic = Traffic(fleet.client("us-east"), tokens=150, concurrency=0)
        long = [asyncio.ensure_future(traffic.one()) for _ in range(4)]

        async def both_busy() -> bool:
            return all(e["running_requests"] > 0 for e in await _engines(fleet))

        await eventually(both_busy, within_s=20, every_s=0.1)
        # The streams must outlast the push of the change on a loaded machine: the engines
        # slow to a crawl until one has gone, then the one left runs fast.
        await fleet.speed_engines("us-east", 40)
        await patch(fleet.cp.url, DEPLOYMENT, {"replicas": 1})

        async def one_left() -> bool:
            return len(await _engines(fleet)) == 1

        await eventually(one_left, within_s=30, every_s=0.1)
        stopped_while_streaming = not all(t.done() for t in long)
        await fleet.speed_engines("us-east", 0.2)
        await asyncio.gather(*long)
        with contextlib.suppress(Exception):
            await traffic.client.close()
        status = await fleet.status("us-east")
    assert stopped_while_streaming  # the engine stopped at its deadline, not after the streams
    assert traffic.failed == []
    assert traffic.served == 4
    drained = [m for m in status["migrations"] if m["why"] == "drained"]
    assert drained
    assert drained[0]["to"] == "region"
