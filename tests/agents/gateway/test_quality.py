"""The quality guard in a region's gateway, over real simulated engines: a worker that emits
garbage while healthy by every other check is quarantined, with its evidence, within 50 of
its requests and routed around; a worker slower for its hardware or its load is never
quarantined for being slower. (The
model's last worker, alerted on and never quarantined: tests/agents/quality/test_guard.py.)"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import Any

import httpx
import orjson

from tests.agents.gateway.inproc import KEY, MODEL, Local, local_gateway, region_config
from tests.agents.sim_kit import Sim, running_sim

AUTH = {"Authorization": f"Bearer {KEY}"}


def _garbled(text: str) -> bool:
    return any(0x2580 <= ord(c) < 0x2600 for c in text)


async def _ask(http: httpx.AsyncClient, url: str, i: int) -> str:
    """One chat, streamed every other time: the answer's text."""
    asked = [{"role": "user", "content": f"question {i}: a river"}]
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 24, "stream": i % 2 == 1,
                            "messages": asked}  # fmt: skip
    answer = await http.post(f"{url}/v1/chat/completions", json=body, headers=AUTH)
    assert answer.status_code == 200, answer.text
    if not body["stream"]:
        return str(answer.json()["choices"][0]["message"]["content"])
    docs = [orjson.loads(line[6:]) for line in answer.text.splitlines()
            if line.startswith("data: {")]  # fmt: skip
    return "".join(str((d["choices"][0].get("delta") or {}).get("content") or "")
                   for d in docs if d.get("choices"))  # fmt: skip


async def _region(stack: AsyncExitStack, sims: list[Sim]) -> Local:
    return await stack.enter_async_context(local_gateway(region_config("r", [s.url for s in sims])))


async def test_a_worker_emitting_garbage_is_quarantined_and_routed_around() -> None:
    async with AsyncExitStack() as stack:
        sims = [await stack.enter_async_context(running_sim(model=MODEL)) for _ in range(3)]
        region = await _region(stack, sims)
        async with httpx.AsyncClient(timeout=30) as http:
            made = await http.post(f"{sims[2].url}/sim/faults", json={"output": "garbage"})
            assert made.status_code == 200
            entry = region.gateway.router.table.entries["r-w2"]
            bad = sent = 0
            while not entry.quarantined and sent < 300:
                text = await _ask(http, region.url, sent)
                bad += _garbled(text)
                sent += 1
            assert entry.quarantined, f"not quarantined after {sent} requests ({bad} bad)"
            assert bad <= 50
            after = [await _ask(http, region.url, 1000 + i) for i in range(30)]
        assert not any(_garbled(text) for text in after)
        (event,) = [e for e in region.gateway.quality.recent if e.kind == "quarantined"]
        assert (event.worker, event.model) == ("r-w2", MODEL)
        assert event.check in ("foreign", "repetition")
        assert event.figure > event.peers_figure
        assert event.examples
        assert [e for e in region.gateway.quality.recent if e.worker != "r-w2"] == []


async def test_workers_slower_for_their_hardware_or_their_load_are_not_quarantined() -> None:
    async with AsyncExitStack() as stack:
        # w2 at half speed (a heterogeneous pair); w0 busier than this gateway knows
        sims = [await stack.enter_async_context(running_sim(*args, model=MODEL))
                for args in ((), (), ("--speed-factor", "0.5"))]  # fmt: skip
        region = await _region(stack, sims)
        async with httpx.AsyncClient(timeout=60) as http:
            long = {"text": "a long story", "sampling_params": {"max_new_tokens": 2000}}
            busy = [asyncio.create_task(http.post(f"{sims[0].url}/generate", json=long))
                    for _ in range(24)]  # fmt: skip
            for first in range(0, 60, 5):  # five at a time
                await asyncio.gather(*(_ask(http, region.url, i) for i in range(first, first + 5)))
            for task in busy:
                task.cancel()
        assert list(region.gateway.quality.recent) == []
        assert not any(e.quarantined for e in region.gateway.router.table.entries.values())
        served = region.gateway.quality.guard.book.totals(["r-w0", "r-w1", "r-w2"])[0]
        assert served == 60  # every answer was judged
