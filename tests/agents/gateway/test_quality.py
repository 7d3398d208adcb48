"""The quality guard in a region's gateway, over real simulated engines: a worker that emits
garbage while healthy by every other check is quarantined, with its evidence, within 50 of
its requests and routed around; a worker slower for its hardware or its load is never
quarantined for being slower. (The
model's last worker, alerted on and never quarantined: tests/agents/quality/test_guard.py.)"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any

import httpx
import orjson

from tests.kits.inproc import KEY, MODEL, OTHER_KEY, Local, local_gateway, region_config
from tests.kits.sim import Sim, running_sim

AUTHS = [{"Authorization": f"Bearer {key}"} for key in (KEY, OTHER_KEY)]


def _garbled(text: str) -> bool:
    return any(0x2580 <= ord(c) < 0x2600 for c in text)


async def _ask(http: httpx.AsyncClient, url: str, i: int) -> str:
    """One chat, streamed every other time, from two tenants in turn: the answer's text."""
    asked = [{"role": "user", "content": f"question {i}: a river"}]
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 24, "stream": i % 2 == 1,
                            "messages": asked}  # fmt: skip
    auth = AUTHS[i // 2 % 2]
    answer = await http.post(f"{url}/v1/chat/completions", json=body, headers=auth)
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


async def test_a_tenants_bad_looking_answers_take_no_healthy_worker_out() -> None:
    """Issue 40's attack: after ordinary traffic from two tenants, one tenant sends requests
    under one long prefix (so the router sends them all to the worker that caches it) whose
    answers look bad by its own doing: `max_tokens` 0 (empty), 1 (cut on length), and a
    prompt that breaks the JSON it asks for (a marker every engine here fails). All three
    healthy workers stay in rotation."""
    async with AsyncExitStack() as stack:
        sims = [await stack.enter_async_context(running_sim("--fail-marker", "BREAK",
                                                            model=MODEL))
                for _ in range(3)]  # fmt: skip
        config = region_config("r", [s.url for s in sims])
        unbounded = {h: replace(k, tenant=replace(k.tenant, tokens_per_minute=None))
                     for h, k in config.keys.items()}  # fmt: skip
        config = replace(config, keys=unbounded)
        region = await stack.enter_async_context(local_gateway(config))
        async with httpx.AsyncClient(timeout=30) as http:
            for first in range(0, 40, 4):
                await asyncio.gather(*(_ask(http, region.url, i) for i in range(first, first + 4)))
            prefix = " ".join(f"word{i % 97}" for i in range(1200))
            attacks: list[dict[str, Any]] = [
                {"max_tokens": 0}, {"max_tokens": 1},
                {"max_tokens": 40, "response_format": {"type": "json_object"}, "marked": True},
            ]  # fmt: skip
            for i in range(90):
                attack = dict(attacks[i % 3])
                tail = " BREAK:json" if attack.pop("marked", False) else ""
                asked = [{"role": "user", "content": f"{prefix} question {i}{tail}"}]
                body = {"model": MODEL, "messages": asked, **attack}
                answer = await http.post(f"{region.url}/v1/chat/completions", json=body,
                                         headers=AUTHS[0])  # fmt: skip
                assert answer.status_code == 200, answer.text
            await asyncio.sleep(0.5)  # a review or two
        quality = region.gateway.quality
        assert not any(e.quarantined for e in region.gateway.router.table.entries.values())
        assert [e for e in quality.recent if e.kind == "quarantined"] == []
        # the attack did land on one worker: without the rules, enough to quarantine it
        _, flagged = quality.guard.book.totals(["r-w0", "r-w1", "r-w2"])
        most = max(quality.guard.book.totals([w])[1]["invalid"] for w in ("r-w0", "r-w1", "r-w2"))
        assert most >= 20, flagged
        assert flagged["empty"] == flagged["length"] == 0  # what the client asked for
