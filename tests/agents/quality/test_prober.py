"""Canaries in a region's gateway over real simulated engines: made from the replicas'
majority, they catch wrong weights with no user traffic at all, readmit the worker once the
fault is cleared, and are held back from a worker that has requests waiting."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from dataclasses import replace

import aiohttp
import httpx

from agents.engines import metrics as engine_metrics
from agents.quality.canary import Canary
from agents.quality.guard import FAILS_IN_ROW, PASSES_IN_ROW
from agents.quality.prober import GOLDEN, Prober
from tests.kits.inproc import KEY, MODEL, Local, local_gateway, region_config
from tests.kits.sim import running_sim


def _prober(region: Local, saved: list[dict[str, list[Canary]]]) -> Prober:
    return Prober(region.gateway.router, region.gateway.quality, save=saved.append)


async def test_wrong_weights_are_caught_by_canaries_alone_and_readmitted_when_cleared() -> None:
    saved: list[dict[str, list[Canary]]] = []
    async with AsyncExitStack() as stack:
        sims = [await stack.enter_async_context(running_sim(model=MODEL)) for _ in range(3)]
        region = await stack.enter_async_context(
            local_gateway(region_config("r", [s.url for s in sims]))
        )
        prober = _prober(region, saved)
        entry = region.gateway.router.table.entries["r-w2"]
        async with aiohttp.ClientSession() as http, httpx.AsyncClient() as client:
            await prober.tick(http)  # the canaries are made from the three
            (made,) = saved
            assert [c.name for c in made[MODEL]] == [name for name, _ in GOLDEN]
            assert all(c.reference and c.expected is not None for c in made[MODEL])
            await client.post(f"{sims[2].url}/sim/faults", json={"logprob_shift": 0.3})
            for _ in range(FAILS_IN_ROW):
                await prober.tick(http)
            assert entry.quarantined
            await client.post(f"{sims[2].url}/sim/faults", json={"logprob_shift": 0})
            for _ in range(PASSES_IN_ROW - 1):
                await prober.tick(http)
                assert entry.quarantined  # passes in a row, not one
            await prober.tick(http)
            assert not entry.quarantined
        kinds = [(e.kind, e.worker) for e in region.gateway.quality.recent]
        assert kinds == [("quarantined", "r-w2"), ("readmitted", "r-w2")]
        quarantined = region.gateway.quality.recent[0]
        assert quarantined.check.startswith("canary:")
        assert quarantined.figure < quarantined.peers_figure  # its score under the bound
        assert len(saved) == 1  # made once, then kept


async def test_a_worker_with_requests_waiting_gets_no_canary() -> None:
    async with AsyncExitStack() as stack:
        sims = [await stack.enter_async_context(running_sim(*args, model=MODEL))
                for args in (("--max-running-requests", "1"), (), ())]  # fmt: skip
        region = await stack.enter_async_context(
            local_gateway(region_config("r", [s.url for s in sims]))
        )
        made = {MODEL: [Canary(name, prompt, " and so on.") for name, prompt in GOLDEN]}
        prober = Prober(region.gateway.router, region.gateway.quality, made)
        table = region.gateway.router.table
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"text": "busy", "sampling_params": {"max_new_tokens": 400}}
            busy = [asyncio.create_task(client.post(f"{sims[0].url}/generate", json=body))
                    for _ in range(4)]  # fmt: skip
            async with asyncio.timeout(20):
                while table.entries["r-w0"].load.waiting == 0:  # noqa: ASYNC110 - the poller's
                    await asyncio.sleep(0.05)
            async with aiohttp.ClientSession() as http:
                await prober.tick(http)
            for task in busy:
                task.cancel()
        assert prober.sent["r-w0"] == 0
        assert prober.skipped["r-w0"] == 1
        assert prober.sent["r-w1"] == prober.sent["r-w2"] == 1


async def test_the_models_last_worker_in_rotation_is_alerted_on_and_keeps_serving() -> None:
    async with AsyncExitStack() as stack:
        sims = [await stack.enter_async_context(running_sim(model=MODEL)) for _ in range(2)]
        region = await stack.enter_async_context(
            local_gateway(region_config("r", [s.url for s in sims]))
        )
        prober = Prober(region.gateway.router, region.gateway.quality)
        entries = region.gateway.router.table.entries
        async with aiohttp.ClientSession() as http, httpx.AsyncClient(timeout=30) as client:
            await prober.tick(http)  # made from the two
            await client.post(f"{sims[1].url}/sim/faults", json={"logprob_shift": 1.0})
            for _ in range(FAILS_IN_ROW):
                await prober.tick(http)
            assert entries["r-w1"].quarantined
            await client.post(f"{sims[0].url}/sim/faults", json={"logprob_shift": 1.0})
            for _ in range(FAILS_IN_ROW + 1):
                await prober.tick(http)
            assert not entries["r-w0"].quarantined  # the last: alerted on, never held out
            asked = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                     "max_tokens": 4}  # fmt: skip
            answer = await client.post(f"{region.url}/v1/chat/completions", json=asked,
                                       headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
            assert answer.status_code == 200, answer.text
        events = [(e.kind, e.worker) for e in region.gateway.quality.recent]
        assert events == [("quarantined", "r-w1"), ("alert", "r-w0")]
        assert region.gateway.quality.held_states() == {
            (MODEL, "r-w0"): "alert",
            (MODEL, "r-w1"): "quarantined",
        }


async def test_new_weights_for_the_model_make_its_canaries_anew() -> None:
    saved: list[dict[str, list[Canary]]] = []
    async with AsyncExitStack() as stack:
        sims = [await stack.enter_async_context(running_sim(model=MODEL)) for _ in range(2)]
        region = await stack.enter_async_context(
            local_gateway(region_config("r", [s.url for s in sims]))
        )
        old = {MODEL: [Canary(n, p, " and so on.", -9.0, source="old/weights") for n, p in GOLDEN]}
        prober = Prober(region.gateway.router, region.gateway.quality, old, save=saved.append)
        async with aiohttp.ClientSession() as http:
            await prober.tick(http)
        (made,) = saved
        source = region.config.models[MODEL].source
        assert [c.source for c in made[MODEL]] == [source] * len(GOLDEN)
        assert all(c.reference != " and so on." for c in made[MODEL])
        assert list(region.gateway.quality.recent) == []  # nobody judged on the old ones


async def test_pd_workers_get_no_canary() -> None:
    """A prefill or decode worker answers only as half of a pair: a canary sent to one alone
    would wait for the other half (SGLang's decode server waits for the KV cache), holding a
    draining engine for its whole drain."""
    async with AsyncExitStack() as stack:
        sims = [await stack.enter_async_context(running_sim(*args, "--enable-metrics",
                                                            model=MODEL))
                for args in (("--disaggregation-mode", "prefill"),
                             ("--disaggregation-mode", "decode"))]  # fmt: skip
        config = region_config("r", [s.url for s in sims])
        roles = ("prefill", "decode")
        workers = tuple(replace(w, role=r, bootstrap_port=8998 if r == "prefill" else None)
                        for w, r in zip(config.workers, roles, strict=True))  # fmt: skip
        region = await stack.enter_async_context(local_gateway(replace(config, workers=workers)))
        prober = _prober(region, [])
        async with aiohttp.ClientSession() as http, httpx.AsyncClient() as client:
            for _ in range(3):
                await prober.tick(http)
            for sim in sims:  # not one request reached them
                metrics = (await client.get(f"{sim.url}/metrics")).text
                assert engine_metrics.parse(metrics).requests == 0, metrics


async def test_a_canary_is_in_flight_as_any_request_and_trips_no_breaker() -> None:
    """A canary takes the router's ticket: while one hangs on a worker, admission and the audit
    count it there (the worker has one request in flight, unstarted); when it times out, the
    ticket is given back and the worker's breaker is as it was: a canary's failure is the
    quality guard's to judge."""
    async with AsyncExitStack() as stack:
        sims = [await stack.enter_async_context(running_sim(model=MODEL)) for _ in range(2)]
        region = await stack.enter_async_context(
            local_gateway(region_config("r", [s.url for s in sims]))
        )
        made = {MODEL: [Canary(name, prompt, " and so on.") for name, prompt in GOLDEN]}
        prober = Prober(region.gateway.router, region.gateway.quality, made)
        view = region.gateway.router.views["r-w1"]
        timeout = aiohttp.ClientTimeout(total=2)  # the canary's, as the prober's own session
        async with aiohttp.ClientSession(timeout=timeout) as http, httpx.AsyncClient() as client:
            await client.post(f"{sims[1].url}/sim/faults", json={"hang": True})
            tick = asyncio.create_task(prober.tick(http))
            async with asyncio.timeout(5):
                while view.inflight == 0:  # noqa: ASYNC110 - the prober's task sends it
                    await asyncio.sleep(0.02)
            assert (view.inflight, view.unstarted) == (1, 1)
            assert region.gateway.router.views["r-w0"].learned == 0  # it teaches nothing
            await tick
            await client.post(f"{sims[1].url}/sim/faults", json={"hang": False})
        assert prober.sent["r-w1"] == 1
        assert (view.inflight, view.unstarted) == (0, 0)
        assert str(view.breaker.state) == "closed"
        assert not region.gateway.router.live.get("r-w1")
