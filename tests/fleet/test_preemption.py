"""A spot machine taken back (issue 42), on a real fleet: its agent reads the notice where its
cloud would give it (here a metadata endpoint the test serves, in the shape Meridian reads),
drains its engines at once while the streams they run finish whole, escalation serves the
region's new requests meanwhile, and the control plane takes the node out of placement
(tests/controlplane/test_preemptions.py: the engines go to the region's other node)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import openai
import pytest_asyncio
from aiohttp import web
from openai.types.chat import ChatCompletionMessageParam

from tests.kits.fleet import LLAMA, fleet_of
from tests.kits.http import served
from tests.kits.push import ADMIN, eventually

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell a long story."}]


class Metadata:
    """A cloud's metadata endpoint: no notice (404), until `give` is called."""

    def __init__(self) -> None:
        self.deadline: datetime | None = None
        self.url = ""

    def give(self, in_s: float) -> None:
        self.deadline = datetime.now(UTC) + timedelta(seconds=in_s)

    async def answer(self, request: web.Request) -> web.Response:
        if self.deadline is None:
            return web.Response(status=404)
        return web.json_response({"action": "terminate", "time": self.deadline.isoformat()})


@pytest_asyncio.fixture(loop_scope="session")
async def metadata() -> AsyncIterator[Metadata]:
    metadata = Metadata()
    app = web.Application()
    app.router.add_get("/spot/notice", metadata.answer)
    async with served(app) as url:
        metadata.url = f"{url}/spot/notice"
        yield metadata


async def _stream(client: openai.AsyncOpenAI, started: asyncio.Event) -> str:
    chunks = await client.chat.completions.create(
        model=LLAMA, messages=HELLO, max_tokens=300, stream=True
    )
    finished = "cut"
    async for chunk in chunks:
        started.set()
        if chunk.choices and chunk.choices[0].finish_reason:
            finished = chunk.choices[0].finish_reason
    return finished


async def test_a_notice_drains_the_node_while_its_streams_finish_and_peers_serve(
    database_url: str, tmp_path: Path, metadata: Metadata
) -> None:
    notices = {"us-east": {"MERIDIAN_AGENT_PREEMPTION_NOTICES": metadata.url,
                           "MERIDIAN_AGENT_PREEMPTION_POLL_S": "0.2"}}  # fmt: skip
    async with fleet_of(
        database_url, tmp_path, ("us-east", "us-west"), region_env=notices
    ) as fleet:
        client = fleet.client("us-east").with_options(timeout=60)
        started = [asyncio.Event() for _ in range(3)]
        streams = [asyncio.create_task(_stream(client, s)) for s in started]
        await asyncio.gather(*(s.wait() for s in started))
        metadata.give(in_s=120)

        async def drained() -> bool:
            status = await fleet.status("us-east")
            return status["preemption"] is not None and all(
                e["state"] != "ready" for e in status["engines"]
            )

        await eventually(drained, within_s=10)
        after = []
        for _ in range(5):  # the region's new requests, while its only node goes
            raw = await client.chat.completions.with_raw_response.create(
                model=LLAMA, messages=HELLO, max_tokens=4
            )
            raw.parse()
            after.append(raw.headers["x-meridian-region"])
        finished = await asyncio.gather(*streams)

        async def out_of_placement() -> bool:
            async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN) as http:
                node = (await http.get("/v1/nodes/us-east-1")).json()
            return bool(node["state"] == "draining")

        await eventually(out_of_placement, within_s=10)
        await client.close()
    assert finished == ["length"] * 3  # whole, on the engine that drained
    assert set(after) == {"us-west"}
