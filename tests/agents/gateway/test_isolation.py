"""What one tenant does never reaches another's requests: a client's X-Request-ID is its to
choose, so two tenants may choose the same, and one leaving (which aborts its engine request
by id) must not abort the other's; a client that stops reading holds its slot only so long."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import replace

import httpx
from meridian_pb.fleet.v1.params import CostParams

from agents.config import ModelConfig, RouteConfig
from agents.gateway.limits import Limits
from agents.gateway.requests import cache_salt
from tests.kits.inproc import KEY, MODEL, OTHER_KEY, local_gateway, region_config
from tests.kits.sim import running_sim, sse

LONG = {MODEL: ModelConfig(MODEL, 131072, frozenset())}  # room for a very long answer


def _stream(tokens: int) -> dict[str, object]:
    return {"model": MODEL, "stream": True, "max_tokens": tokens,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "tell me a long story"}]}  # fmt: skip


async def test_a_tenant_leaving_under_anothers_request_id_aborts_only_its_own() -> None:
    async with (
        running_sim("--speed-factor", "0.2", model=MODEL) as sim,
        local_gateway(region_config("r", [sim.url])) as region,
        httpx.AsyncClient(base_url=region.url, timeout=60) as http,
    ):
        same = {"X-Request-ID": "order-42"}
        victim = asyncio.create_task(http.post(
            "/v1/chat/completions", json=_stream(60),
            headers={**same, "Authorization": f"Bearer {OTHER_KEY}"},
        ))  # fmt: skip
        await asyncio.sleep(0.3)  # the victim's request is generating
        headers = {**same, "Authorization": f"Bearer {KEY}"}
        async with http.stream("POST", "/v1/chat/completions", json=_stream(60),
                               headers=headers) as leaving:  # fmt: skip
            async for _ in leaving.aiter_bytes():
                break  # the first bytes, and gone: the gateway aborts its engine request
        answer = await victim
        counted = dict(region.gateway.books.by_tenant)
    assert answer.status_code == 200
    # each tenant's answers are counted as its own (a rollout's checks read them per tenant)
    assert counted[MODEL, "beta", "ok"] == 1
    assert counted[MODEL, "beta", "@timed"] == 1  # streamed: its first token was timed
    assert answer.headers["x-request-id"] == "order-42"
    events = await sse(answer)
    assert events[-1] == "[DONE]"
    usage = next(e["usage"] for e in reversed(events) if isinstance(e, dict) and e.get("usage"))
    assert usage["completion_tokens"] == 60


async def test_a_client_that_stops_reading_is_cut_and_frees_its_slot() -> None:
    """A stream whose client reads nothing (its window shut) holds its worker only for the
    stall bound: then it is cut, its engine request aborted, and counted."""
    limits = Limits(client_stall_s=1.0)
    async with (
        running_sim("--speed-factor", "50", model=MODEL) as sim,
        local_gateway(region_config("r", [sim.url], models=LONG), limits=limits) as region,
    ):
        # a request of more than the buffers hold, whose client then reads nothing
        async with _never_reading(region.url):
            seen = await _eventually(lambda: region.inflight()["r-w0"] == 1, 10)
            assert seen, "the stream never started"
            # within the bound and a little, all is let go
            cut = await _eventually(region.idle, 15)
        assert cut, f"still held: {region.inflight()}"
        async with httpx.AsyncClient(timeout=10) as http:
            load = (await http.get(f"{sim.url}/v1/loads")).json()["loads"][0]
        assert load["num_running_reqs"] == 0  # the engine stopped generating it
        assert region.gateway.books.answered[MODEL, "client_stalled"] == 1, (
            region.gateway.books.answered
        )


async def _eventually(check: Callable[[], bool], within_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not check():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def test_a_tenants_long_streams_leave_another_tenant_served() -> None:
    """Issue 40: acme opens ten streams asking for 100,000 tokens each (five of its clients
    never read); eurobank, whose only region this is, is still served, where before every
    one of its requests was refused `overloaded` (the streams' answers, reserved in full,
    left no room). acme's eleventh request, over its share, waits behind eurobank's."""
    async with AsyncExitStack() as stack:
        sims = [await stack.enter_async_context(running_sim(model=MODEL)) for _ in range(2)]
        config = region_config("r", [s.url for s in sims], models=LONG,
                               routes={MODEL: RouteConfig(MODEL, "cost", CostParams(), 2.0,
                                                          0.05, None, 128)})  # fmt: skip
        config = replace(config, keys={h: replace(k, tenant=replace(
            k.tenant, tokens_per_minute=None)) for h, k in config.keys.items()})  # fmt: skip
        region = await stack.enter_async_context(local_gateway(config))
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=region.url, timeout=600))

        async def eurobank() -> tuple[int, str]:
            body = {"model": MODEL, "max_tokens": 16,
                    "messages": [{"role": "user", "content": "hello there"}]}  # fmt: skip
            answer = await http.post("/v1/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {OTHER_KEY}"})  # fmt: skip
            return answer.status_code, "" if answer.is_success else answer.text

        async def reading() -> None:
            acme = {"Authorization": f"Bearer {KEY}"}
            body = _stream(100_000)
            async with http.stream("POST", "/v1/chat/completions", json=body, headers=acme) as a:
                async for _ in a.aiter_bytes():
                    pass

        assert [await eurobank() for _ in range(3)] == [(200, "")] * 3
        streams = [asyncio.create_task(reading()) for _ in range(5)]
        silent = [await stack.enter_async_context(_never_reading(region.url)) for _ in range(5)]
        assert len(silent) == 5
        await _eventually(lambda: sum(region.inflight().values()) == 10, 10)
        during = [await eurobank() for _ in range(8)]
        for task in streams:
            task.cancel()
    assert during == [(200, "")] * 8


@contextlib.asynccontextmanager
async def _never_reading(url: str) -> AsyncIterator[socket.socket]:
    """acme's stream from a client that sends its request and reads nothing."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(_stream(100_000)).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    await loop.sock_sendall(sock, head + body)
    try:
        yield sock
    finally:
        sock.close()


async def test_what_one_tenant_cached_never_shows_in_anothers_answers() -> None:
    """Issue 40 §4: with one prefix cache for all, a tenant could learn whether another sent a
    prompt: its own copy of that prompt would come back with cached tokens (and sooner). Each
    tenant's requests carry its own `cache_salt`, so a prefix is cached per tenant; a salt a
    client sends is folded into its tenant's, so it cannot name another's."""
    secret = "the merger closes on friday; the price is forty-two. " * 40
    async with AsyncExitStack() as stack:
        sim = await stack.enter_async_context(running_sim("--enable-cache-report", model=MODEL))
        region = await stack.enter_async_context(local_gateway(region_config("r", [sim.url])))
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=region.url, timeout=60))

        async def cached(key: str, salt: object = None) -> int:
            body = {"model": MODEL, "max_tokens": 4,
                    "messages": [{"role": "user", "content": secret}]}  # fmt: skip
            if salt is not None:
                body["cache_salt"] = salt
            answer = await http.post("/v1/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {key}"})  # fmt: skip
            assert answer.status_code == 200, answer.text
            return int(answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

        assert await cached(KEY) == 0
        assert await cached(KEY) > 100  # acme's own prompt, cached for acme
        assert await cached(OTHER_KEY) == 0  # beta learns nothing of what acme sent
        assert await cached(OTHER_KEY) > 100  # and its own is cached for it
        acme_salt = cache_salt("acme")
        assert await cached(OTHER_KEY, acme_salt) == 0  # naming acme's salt reaches nothing
        assert await cached(KEY, "own") == 0  # a client's salt: a namespace within its tenant's
        bad = await http.post("/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                              json={"model": MODEL, "cache_salt": 7,
                                    "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"]["param"] == "cache_salt"
