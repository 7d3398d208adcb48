"""What the agent reads of an engine's answers (agents/engines/contract.py), from a real
simulator; the conformance test holds the simulator's answers to the real SGLang's."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx

from agents.engines import contract
from tests.kits.sim import running_sim


async def _step(client: httpx.AsyncClient) -> float:
    return contract.read_loads((await client.get(contract.LOADS)).json()).step_s


async def test_the_decode_step_is_read_from_a_running_engine_before_anything_finishes() -> None:
    """Eight answers of 2,000 tokens run: no counter has moved yet, but the scheduler's
    load (running requests over tokens a second, from /v1/loads) gives the step their tokens
    come at. (Its steps are slowed fivefold, to 30 ms, so that a busy machine reads the
    streams as fast as they come; the load tells the step after 40 of them, as SGLang's
    decode log does.)"""
    body = {"text": "a prompt", "sampling_params": {"max_new_tokens": 2000}, "stream": True}
    slowed = ("--enable-metrics", "--slow-factor", "5")
    async with running_sim(*slowed) as sim, sim.client(timeout=60) as client:
        assert await _step(client) == 0.0  # nothing runs

        async def answer() -> list[float]:
            times: list[float] = []
            async with client.stream("POST", "/generate", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        times.append(time.perf_counter())
                    if len(times) > 100:
                        break
            return times

        streams = [asyncio.create_task(answer()) for _ in range(8)]
        await asyncio.sleep(2.0)  # 40 steps and more
        step = await _step(client)
        done = await asyncio.gather(*streams)
    gap = statistics.median((times[-1] - times[10]) / (len(times) - 11) for times in done)
    assert step > 0, "no step while answers run"
    assert gap / 2 < step < gap * 2, (step, gap)
