"""A request's service class at the gateway, over a real simulated engine: named by OpenAI's
service_tier or x-meridian-class, clamped to the tenant's ceiling, said in the answer; a
value that is no class is a 400 that changes nothing."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import replace
from functools import partial
from typing import Any

import httpx
import pytest
from meridian_pb.fleet.v1.classes import ClassPolicy, ServiceClass, policy_for
from prometheus_client.parser import text_string_to_metric_families

from agents.config import RegionConfig
from agents.engines.backends import priority_flags
from agents.engines.contract import engine_priority
from agents.router.classes import YIELDS
from tests.kits.inproc import (
    KEY,
    MODEL,
    OPERATOR,
    OTHER,
    OTHER_KEY,
    Local,
    local_gateway,
    region_config,
)
from tests.kits.sim import Sim, running_sim

LONG = 60  # tokens of a long answer: seconds on the slow engine of `_one_slot`


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            **extra}  # fmt: skip


async def test_a_request_names_its_class_and_is_clamped_to_its_tenants_ceiling() -> None:
    """acme has the defaults (standard, and no higher); beta may ask for interactive."""
    async with AsyncExitStack() as stack:
        sim = await stack.enter_async_context(running_sim(model=MODEL))
        config = _beta_may_ask_interactive(sim.url)
        region = await stack.enter_async_context(local_gateway(config))
        async with httpx.AsyncClient(base_url=region.url, timeout=30) as client:

            async def served(key: str = KEY, header: str | None = None, **extra: Any) -> str:
                headers = {"Authorization": f"Bearer {key}"}
                if header is not None:
                    headers["x-meridian-class"] = header
                answer = await client.post("/v1/chat/completions", json=_body(**extra),
                                           headers=headers)  # fmt: skip
                assert answer.status_code == 200, answer.text
                served = answer.headers["x-meridian-class"]
                tier = {"interactive": "priority", "standard": "default"}.get(served, served)
                assert answer.headers["x-meridian-service-tier"] == tier
                return served

            assert await served() == "standard"  # none named: the tenant's default
            assert await served(service_tier="auto") == "standard"
            assert await served(service_tier="flex") == "flex"
            assert await served(service_tier="priority") == "standard"  # above its ceiling
            assert await served(header="interactive") == "standard"
            assert await served(header="batch") == "batch"
            assert await served(header="batch", service_tier="flex") == "batch"  # the lower
            assert await served(OTHER_KEY, service_tier="priority") == "interactive"
            assert await served(OTHER_KEY) == "standard"
            assert await served(OPERATOR, header="interactive") == "interactive"
            for header, extra, param in (
                ("gold", {}, "x-meridian-class"),
                (None, {"service_tier": "scale-up"}, "service_tier"),
            ):
                headers = {"Authorization": f"Bearer {KEY}"}
                if header is not None:
                    headers["x-meridian-class"] = header
                refused = await client.post("/v1/chat/completions", json=_body(**extra),
                                            headers=headers)  # fmt: skip
                assert refused.status_code == 400, refused.text
                assert refused.json()["error"]["param"] == param
            assert region.idle()


@pytest.mark.parametrize("mode", ["preempt", "requeue", "neither"])
async def test_a_higher_class_preempts_a_request_its_engine_has_not_started(mode: str) -> None:
    """One engine runs one request at a time (--max-running-requests 1), busy with a long
    standard answer; two batch requests were sent there and wait in its queue (at most two
    unstarted, the cost policy's max_unstarted). An interactive request that would wait takes
    the newest one's place: that batch request is aborted on the engine and answered 503
    preempted with Retry-After, the other is served, and so is the interactive one. Where
    batch requeues instead (its default), the one taken waits again and is served too;
    with neither, nobody's place is taken."""
    preempt = mode == "preempt"
    async with AsyncExitStack() as stack:
        sim = await stack.enter_async_context(
            running_sim("--max-running-requests", "1", "--slow-factor", "20", model=MODEL)
        )
        classes = policy_for({"batch": {"slack": 1.0, "requeue": mode == "requeue"},
                              "preempt": preempt})  # fmt: skip
        config = _beta_may_ask_interactive(sim.url, classes, slo_s=30.0)
        region = await stack.enter_async_context(local_gateway(config))
        async with httpx.AsyncClient(base_url=region.url, timeout=60) as client:

            async def ask(header: str, max_tokens: int) -> httpx.Response:
                return await client.post(
                    "/v1/chat/completions", json=_body() | {"max_tokens": max_tokens},
                    headers={"Authorization": f"Bearer {OTHER_KEY}", "x-meridian-class": header},
                )  # fmt: skip

            long = asyncio.create_task(ask("standard", 60))
            await _until(lambda: _running(region) == 1)
            batch = []
            for waiting in (1, 2):  # each in the engine's queue before the next is sent: a
                # poll while one is still on its way would take it to have started
                # (agents/router/view.py, _whole_started), and the interactive one would fit
                batch.append(asyncio.create_task(ask("batch", 2)))
                await _until_async(partial(_sim_waiting, client, sim, waiting))
            await _until(lambda: _unstarted(region) == 2)
            interactive = await ask("interactive", 2)
            answers = [await b for b in batch]
            assert (await long).status_code == 200
        assert interactive.status_code == 200, interactive.text
        assert interactive.headers["x-meridian-class"] == "interactive"
        codes = sorted(a.status_code for a in answers)
        books = region.gateway.books.classes
        if not preempt:
            assert codes == [200, 200], [a.text for a in answers]
            assert not books[MODEL, "batch", "preempted"]
            # requeued, the one taken gives way and the interactive request goes in its place
            assert books[MODEL, "batch", "requeued"] == (1 if mode == "requeue" else 0)
            assert region.idle()
            return
        assert codes == [200, 503], [a.text for a in answers]
        preempted = next(a for a in answers if a.status_code == 503)
        assert preempted.json()["error"]["code"] == "preempted"
        assert int(preempted.headers["Retry-After"]) >= 1
        assert region.gateway.books.classes[MODEL, "batch", "preempted"] == 1
        assert region.idle()


@pytest.mark.alone  # an order of answers on a timed engine: a busy machine skews it
@pytest.mark.parametrize("stream", [False, True])
async def test_a_running_batch_request_gives_way_until_its_client_sees_a_byte(
    stream: bool,
) -> None:
    """One engine that runs one request at a time, busy with a long batch answer. An
    interactive request that would wait past its SLO for its slot takes its room: the batch
    request is aborted on the engine, waits again, and is served whole after it; its client
    sees only the wait. Its whole answer was gathered from a stream, so it keeps its work:
    carried on from what the engine made before it gave way, it reads as the answer given
    without a break, and the engine made each of its tokens once. A batch stream its client
    has seen a byte of is never taken: the interactive request waits for it."""
    async with AsyncExitStack() as stack:
        sim, region = await _one_slot(stack, max_wait_s=120)
        ended: list[str] = []
        async with httpx.AsyncClient(base_url=region.url, timeout=120) as client:
            seen = asyncio.Event()  # the batch request's client has a byte of its answer

            async def ask(header: str, max_tokens: int, streamed: bool = False) -> str:
                body = _body() | {"max_tokens": max_tokens, "stream": streamed}
                headers = {"Authorization": f"Bearer {OTHER_KEY}", "x-meridian-class": header}
                async with client.stream(
                    "POST", "/v1/chat/completions", json=body, headers=headers
                ) as answer:
                    assert answer.status_code == 200, await answer.aread()
                    chunks = []
                    async for chunk in answer.aiter_text():
                        seen.set()
                        chunks.append(chunk)
                ended.append(header)
                return "".join(chunks)

            tokens = 40 if stream else LONG
            started = time.monotonic()
            whole = json.loads(await ask("standard", tokens))  # the engine's step learned, and
            # the answer unbroken (the simulator's is a function of the prompt and answer so
            # far, as greedy decoding is)
            took = time.monotonic() - started
            ended.clear()
            seen.clear()
            batch = asyncio.create_task(ask("batch", tokens, stream))
            if stream:  # taken only until its client sees a byte: wait for that byte
                await asyncio.wait_for(seen.wait(), 60)
            else:
                for _ in range(500):  # until the engine runs it
                    loads = (await client.get(f"{sim.url}/v1/loads")).json()["loads"][0]
                    if loads["num_running_reqs"]:
                        break
                    await asyncio.sleep(0.02)
                await asyncio.sleep(took / 3)  # and has made a good part of it
            made = await _generated(client, sim)
            await ask("interactive", 2)
            text = await batch
            generated = await _generated(client, sim) - made
        books = region.gateway.books.classes
        if stream:
            assert ended == ["batch", "interactive"]  # it waited for the stream
            assert not books[MODEL, "batch", "requeued"]
            assert text.rstrip().endswith("data: [DONE]")
        else:
            assert ended == ["interactive", "batch"], dict(books)
            assert books[MODEL, "batch", "requeued"] == 1
            answer = json.loads(text)
            assert answer["choices"][0]["finish_reason"] == "length"
            assert answer["usage"]["completion_tokens"] == LONG  # served whole, once
            assert answer["choices"][0]["message"] == whole["choices"][0]["message"]
            assert answer["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]
            assert answer["object"] == "chat.completion"
            # its LONG and the interactive request's 2, and the few the engine made between the
            # last event the gateway read and the abort (started over: a third of LONG more)
            assert generated <= LONG + 2 + 6
        assert region.idle()


@pytest.mark.alone  # answers on a timed engine: a busy machine skews them
@pytest.mark.parametrize("gathered", [False, True])
async def test_a_batch_request_gives_way_twice_at_most_then_runs_to_its_end(
    gathered: bool,
) -> None:
    """One engine that runs one request at a time, busy with a long batch answer, and three
    interactive requests in turn, each of which would wait past its SLO: the first two take
    the batch request's room; the third does not, and the batch request, admitted a third
    time, is served whole. A gathered answer keeps what it made each time; one that sets a
    field a continuation may read differently (here a penalty) is not gathered, and starts
    over each time."""
    async with AsyncExitStack() as stack:
        sim, region = await _one_slot(stack, max_wait_s=3)
        async with httpx.AsyncClient(base_url=region.url, timeout=120) as client:

            async def ask(header: str, max_tokens: int, **more: float) -> httpx.Response:
                body = _body() | {"max_tokens": max_tokens} | more
                headers = {"Authorization": f"Bearer {OTHER_KEY}", "x-meridian-class": header}
                return await client.post("/v1/chat/completions", json=body, headers=headers)

            async def batch_runs() -> bool:
                loads = (await client.get(f"{sim.url}/v1/loads")).json()["loads"][0]
                return bool(loads["num_running_reqs"])

            started = time.monotonic()
            assert (await ask("standard", 40)).status_code == 200  # the engine's step learned
            step = (time.monotonic() - started) / 40
            more = {} if gathered else {"presence_penalty": 0.0}
            batch = asyncio.create_task(ask("batch", 3 * LONG, **more))  # long: it gives way
            made = await _generated(client, sim)
            codes = []
            for _ in range(3):
                async with asyncio.timeout(60):
                    while not await batch_runs():  # noqa: ASYNC110 (another process's state)
                        await asyncio.sleep(0.02)
                await asyncio.sleep(5 * step)  # it makes part of its answer
                codes.append((await ask("interactive", 2)).status_code)
            answer = await batch
            generated = await _generated(client, sim) - made
        books = region.gateway.books.classes
        # the third is not given the batch request's room here: it waits for it (and is
        # refused at its SLO) or the engine's own priority retracts the batch request for
        # its slot (which loses nothing of it)
        assert codes[:2] == [200, 200]
        assert codes[2] in (200, 429)
        assert books[MODEL, "batch", "requeued"] == 2
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 3 * LONG  # served whole, once
        # what the engine made beyond the answer and the interactive answers' 2 tokens each
        extra = generated - 3 * LONG - 2 * codes.count(200)
        if gathered:  # at most the few made between the last event read and each abort
            assert extra <= 2 * 6, (generated, codes)
        else:  # what it made before it gave way, made again
            assert extra >= 2, (generated, codes)
        assert region.idle()


async def _generated(client: httpx.AsyncClient, sim: Sim) -> float:
    """The tokens the engine has made (of requests ended or aborted)."""
    text = (await client.get(f"{sim.url}/metrics")).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "sglang:generation_tokens"
        for sample in family.samples
        if sample.name.endswith("_total")
    )


async def _one_slot(stack: AsyncExitStack, max_wait_s: float) -> tuple[Sim, Local]:
    """A slow engine that runs one request at a time, and a region of it where beta may ask
    for any class: batch admitted on all of the SLO (0.5 s) as slack, bounded by
    `max_wait_s`."""
    sim = await stack.enter_async_context(
        running_sim(
            "--max-running-requests", "1", "--slow-factor", "10", "--enable-metrics", model=MODEL
        )
    )
    classes = policy_for({"batch": {"slack": 1.0, "max_wait_s": max_wait_s}})
    config = _beta_may_ask_interactive(sim.url, classes, slo_s=0.5)
    return sim, await stack.enter_async_context(local_gateway(config))


def _beta_may_ask_interactive(
    url: str, classes: ClassPolicy | None = None, slo_s: float | None = None
) -> RegionConfig:
    """A region of the engine at `url` where tenant beta (OTHER_KEY's) may ask for any
    class; with `classes`, its route has them and a TTFT SLO of `slo_s`."""
    beta = replace(OTHER, class_ceiling=ServiceClass.INTERACTIVE)
    config = region_config("r", [url])
    keys = {h: replace(k, tenant=beta) if k.tenant.name == beta.name else k
            for h, k in config.keys.items()}  # fmt: skip
    routes = config.routes
    if classes is not None:
        routes = {MODEL: replace(routes[MODEL], slo_ttft_s=slo_s, classes=classes)}
    return replace(config, keys=keys, tenants={**config.tenants, beta.name: beta},
                   routes=routes)  # fmt: skip


def _running(region: Local) -> int:
    return sum(v.inflight for v in region.gateway.router.views.values())


def _unstarted(region: Local) -> int:
    return sum(v.unstarted for v in region.gateway.router.views.values())


async def _sim_waiting(client: httpx.AsyncClient, sim: Sim, count: int) -> bool:
    loads = (await client.get(f"{sim.url}/v1/loads")).json()["loads"][0]
    return bool(loads["num_waiting_reqs"] == count)


async def _until_async(probe: Callable[[], Awaitable[bool]], within_s: float = 20.0) -> None:
    async with asyncio.timeout(within_s):
        while not await probe():  # noqa: ASYNC110 (another process: no event to wait on)
            await asyncio.sleep(0.02)


async def _until(probe: Callable[[], bool], within_s: float = 20.0) -> None:
    async with asyncio.timeout(within_s):
        while not probe():  # noqa: ASYNC110 (the gateway's state: no event to wait on)
            await asyncio.sleep(0.02)


async def test_interactive_keeps_its_slo_batch_takes_the_rest_flex_never_waits_forever() -> None:
    """One engine that runs four requests at once (it says so in /v1/loads). Four
    interactive clients keep it busy, each sending its next request as its last ends (at
    capacity); twelve batch clients flood it (three times as many). Interactive keeps its
    SLO: every request served, none refused (its reserve keeps a fifth of the engine's
    slots from batch). Batch is served only from the rest, and what waits past its bound
    (2 s) is refused 429, not left waiting; a flex request (bound 3 s) is answered or
    refused within its bound, never later. (A request that gives way to interactive waits
    again, within its bound counted anew, at most YIELDS times.)"""
    async with AsyncExitStack() as stack:
        sim = await stack.enter_async_context(
            running_sim("--max-running-requests", "4", "--slow-factor", "5", model=MODEL)
        )
        beta = replace(OTHER, class_ceiling=ServiceClass.INTERACTIVE)
        config = region_config("r", [sim.url])
        keys = {h: replace(k, tenant=beta) if k.tenant.name == beta.name else k
                for h, k in config.keys.items()}  # fmt: skip
        classes = policy_for({"batch": {"max_wait_s": 2}, "flex": {"max_wait_s": 3}})
        route = replace(config.routes[MODEL], slo_ttft_s=5.0, classes=classes)
        config = replace(config, keys=keys, tenants={**config.tenants, beta.name: beta},
                         routes={MODEL: route})  # fmt: skip
        region = await stack.enter_async_context(local_gateway(config))
        stop = asyncio.Event()
        seen: dict[str, list[tuple[int, float]]] = {"interactive": [], "batch": [], "flex": []}
        async with httpx.AsyncClient(base_url=region.url, timeout=60) as client:

            async def ask(service_class: str) -> None:
                started = asyncio.get_running_loop().time()
                answer = await client.post(
                    "/v1/chat/completions", json=_body() | {"max_tokens": 16},
                    headers={"Authorization": f"Bearer {OTHER_KEY}",
                             "x-meridian-class": service_class},
                )  # fmt: skip
                took = asyncio.get_running_loop().time() - started
                seen[service_class].append((answer.status_code, took))

            async def keep(service_class: str) -> None:
                while not stop.is_set():
                    await ask(service_class)

            load = [asyncio.create_task(keep("interactive")) for _ in range(4)]
            load += [asyncio.create_task(keep("batch")) for _ in range(12)]
            await asyncio.sleep(2)
            await ask("flex")
            await asyncio.sleep(4)
            stop.set()
            await asyncio.gather(*load)
        interactive, batch = seen["interactive"], seen["batch"]
        assert interactive
        assert {status for status, _ in interactive} == {200}  # none refused, none failed
        assert max(took for _, took in interactive) < 5.0
        assert {status for status, _ in batch} <= {200, 429}
        assert any(status == 200 for status, _ in batch)  # served from the rest
        assert any(status == 429 for status, _ in batch)  # the rest was not enough
        # each wait within its bound, not more: a request that gave way to interactive (at
        # most YIELDS times, each after an answer's length at most) waited anew
        waits = YIELDS + 1
        assert all(took < waits * 2 + 3 for status, took in batch if status == 429)
        ((status, took),) = seen["flex"]
        assert status in (200, 429)
        assert took < waits * 3 + 3
        assert region.idle()


async def test_a_stream_whose_first_token_came_past_the_slo_is_counted_by_its_class() -> None:
    """Per region and class, on the status page and in Prometheus: the admitted streams whose
    first token came past the route's SLO. A whole answer has no first token to time."""
    async with AsyncExitStack() as stack:
        sim = await stack.enter_async_context(
            running_sim("--slow-factor", "200", model=MODEL)  # a first token in about 1.6 s
        )
        config = _beta_may_ask_interactive(sim.url)
        route = replace(config.routes[MODEL], slo_ttft_s=0.5)
        region = await stack.enter_async_context(
            local_gateway(replace(config, routes={MODEL: route}))
        )
        headers = {"Authorization": f"Bearer {OTHER_KEY}", "x-meridian-class": "interactive"}
        async with httpx.AsyncClient(base_url=region.url, timeout=60) as client:
            streamed = await client.post("/v1/chat/completions", headers=headers,
                                         json=_body(stream=True, max_tokens=2))  # fmt: skip
            whole = await client.post("/v1/chat/completions", headers=headers,
                                      json=_body(max_tokens=2))  # fmt: skip
        assert (streamed.status_code, whole.status_code) == (200, 200)
        books = region.gateway.books.classes
        assert books[MODEL, "interactive", "admitted"] == 2
        assert books[MODEL, "interactive", "past_slo"] == 1


async def test_the_engine_is_told_the_class_never_what_a_client_says_its_priority_is() -> None:
    """An engine Meridian starts schedules by priority (agents/engines/backends.py); the
    gateway sends each request's class as SGLang's `priority` and drops a client's own, which
    would otherwise let it jump the engine's queue."""
    flags = priority_flags({})
    async with AsyncExitStack() as stack:
        sim = await stack.enter_async_context(running_sim(*flags, "--enable-metrics", model=MODEL))
        region = await stack.enter_async_context(local_gateway(region_config("r", [sim.url])))
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=region.url, timeout=30) as client:
            for header, extra in (("batch", {"priority": 1000}), ("flex", {"priority": None}),
                                  (None, {})):  # fmt: skip
                sent = {**headers, "x-meridian-class": header} if header else headers
                answer = await client.post("/v1/chat/completions", json=_body(**extra),
                                           headers=sent)  # fmt: skip
                assert answer.status_code == 200, answer.text
            metrics = (await client.get(f"{sim.url}/metrics")).text
    served = {
        labels["priority"]: value
        for family in text_string_to_metric_families(metrics)
        for name, labels, value, *_ in family.samples
        if name == "sglang:num_requests_total"
    }
    classes = (ServiceClass.BATCH, ServiceClass.FLEX, ServiceClass.STANDARD)
    assert served == {str(engine_priority(c)): 1.0 for c in classes}
