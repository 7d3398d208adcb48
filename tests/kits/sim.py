"""Simulators as real child processes, for the agent's tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from meridian import procs
from meridian.procs import free_port, stop_child, wait_ready


@dataclass
class Sim:
    process: asyncio.subprocess.Process
    url: str
    port: int

    def client(self, timeout: float = 10) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=timeout)

    async def healthy(self, timeout_s: float = 30) -> None:
        await wait_ready(self.url, self.process, timeout_s, path="/ready", what="the simulator")


@contextlib.asynccontextmanager
async def running_sim(
    *args: str, model: str = "llama", port: int | None = None
) -> AsyncIterator[Sim]:
    port = port or free_port()
    child = await procs.start_sim(["--model", model, *args], port=port)
    try:
        yield Sim(child.process, child.url, port)
    finally:
        await stop_child(child.process, grace_s=5)


async def sse(response: httpx.Response) -> list[Any]:
    """The `data:` events of a streamed response, decoded; `[DONE]` kept as the string."""
    events: list[Any] = []
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
