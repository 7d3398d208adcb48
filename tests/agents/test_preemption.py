"""Preemption notices as each cloud's metadata service gives them, served over HTTP on loopback
in their shapes (AWS IMDSv2 with its session token, GCP's `preempted`, Azure's scheduled
events, Meridian's own URL): nothing until the notice, then one notice with its deadline,
told once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
import pytest_asyncio
from aiohttp import web

from agents.control.preemption import GCP_AHEAD_S, Notice, PreemptionWatch
from tests.kits.http import served
from tests.kits.push import eventually

WHEN = datetime(2026, 11, 27, 3, 30, tzinfo=UTC)
NOW = WHEN.timestamp() - 100


class Clouds:
    """The three metadata services in one: no notice until `noticed` is set."""

    def __init__(self) -> None:
        self.noticed = False
        self.base = ""

    async def aws_token(self, request: web.Request) -> web.Response:
        assert request.headers["X-aws-ec2-metadata-token-ttl-seconds"]
        return web.Response(text="session-token")

    async def aws(self, request: web.Request) -> web.Response:
        if request.headers.get("X-aws-ec2-metadata-token") != "session-token":
            return web.Response(status=401)  # IMDSv2: no token, no answer
        if not self.noticed:
            return web.Response(status=404)
        return web.json_response({"action": "terminate", "time": "2026-11-27T03:30:00Z"})

    async def gcp(self, request: web.Request) -> web.Response:
        assert request.headers["Metadata-Flavor"] == "Google"
        return web.Response(text="TRUE" if self.noticed else "FALSE")

    async def azure(self, request: web.Request) -> web.Response:
        assert request.headers["Metadata"] == "true"
        events: list[dict[str, object]] = [
            {"EventId": "A1", "EventType": "Freeze", "NotBefore": ""}
        ]
        if self.noticed:
            events.append({"EventId": "B2", "EventType": "Preempt", "ResourceType":
                           "VirtualMachine", "Resources": ["east-h100_3"],
                           "NotBefore": "Fri, 27 Nov 2026 03:30:00 GMT"})  # fmt: skip
        return web.json_response({"DocumentIncarnation": 2, "Events": events})

    async def own(self, request: web.Request) -> web.Response:
        if not self.noticed:
            return web.Response(status=404)
        return web.json_response({"time": WHEN.isoformat()})


@pytest_asyncio.fixture(loop_scope="session")
async def clouds() -> AsyncIterator[Clouds]:
    clouds = Clouds()
    app = web.Application()
    app.router.add_put("/latest/api/token", clouds.aws_token)
    app.router.add_get("/latest/meta-data/spot/instance-action", clouds.aws)
    app.router.add_get("/computeMetadata/v1/instance/preempted", clouds.gcp)
    app.router.add_get("/metadata/scheduledevents", clouds.azure)
    app.router.add_get("/notice", clouds.own)
    async with served(app) as url:
        clouds.base = url
        yield clouds


@pytest.mark.parametrize(
    ("source", "deadline"),
    [("aws", WHEN.timestamp()), ("gcp", NOW + GCP_AHEAD_S), ("azure", WHEN.timestamp()),
     ("own", WHEN.timestamp())],
)  # fmt: skip
async def test_each_clouds_notice_is_read_once_with_its_deadline(
    clouds: Clouds, source: str, deadline: float
) -> None:
    clouds.noticed = False
    told: list[Notice] = []
    name = f"{clouds.base}/notice" if source == "own" else source
    watch = PreemptionWatch(name, 0.05, told.append, clock=lambda: NOW,
                            metadata={c: clouds.base for c in ("aws", "gcp", "azure")})  # fmt: skip
    running = asyncio.create_task(watch.run())
    try:
        await asyncio.sleep(0.3)
        assert told == []  # polled, and nothing to tell
        clouds.noticed = True

        async def noticed() -> bool:
            return bool(told)

        await eventually(noticed, within_s=5)
        await asyncio.sleep(0.2)
    finally:
        running.cancel()
    assert told == [Notice(name, deadline)]  # once
