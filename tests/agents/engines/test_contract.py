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
    come at."""
    body = {"text": "a prompt", "sampling_params": {"max_new_tokens": 2000}, "stream": True}
    async with running_sim("--enable-metrics") as sim, sim.client(timeout=60) as client:
        assert await _step(client) == 0.0  # nothing runs

        async def answer() -> list[float]:
            times: list[float] = []
            async with client.stream("POST", "/generate", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        times.append(time.perf_counter())
                    if len(times) > 400:
                        break
            return times

        streams = [asyncio.create_task(answer()) for _ in range(8)]
        await asyncio.sleep(0.5)
        step = await _step(client)
        done = await asyncio.gather(*streams)
    gap = statistics.median((times[-1] - times[50]) / (len(times) - 51) for times in done)
    assert step > 0, "no step while answers run"
    assert gap / 2 < step < gap * 2, (step, gap)
