"""A fault of the gateway's own, anywhere on a request's path, local or escalated: the client
gets an OpenAI-shaped 500 with its request id (or, once a stream has begun, an error event at
its end), and nothing the request held stays held: worker slots, admission, quota tokens, a
peer's slot. The next request is served.

The faults are exceptions put where no request could cause one (the gateway runs in the
test's process for it); the engines are real simulators."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx
import pytest

from agents.gateway import calls, forward, requests
from agents.gateway.relay import StreamMeter
from agents.router.router import Router
from meridian.procs import free_port
from tests.kits.gateway import sim_load
from tests.kits.inproc import KEY, MODEL, TENANT, Local, escalating_pair, local_gateway
from tests.kits.inproc import region_config as config_of
from tests.kits.push import eventually
from tests.kits.sim import running_sim, sse

AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "tell me a story " * 60  # about 240 tokens, as the router estimates them


def _chat(stream: bool = False) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 8, "stream": stream}  # fmt: skip


def _client(region: Local) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=region.url, headers=AUTH, timeout=10)


def _fails_once(
    monkeypatch: pytest.MonkeyPatch, owner: object, name: str, on_call: int = 1
) -> list[int]:
    """`owner.name` raises RuntimeError on its `on_call`-th call, then works again."""
    real: Callable[..., Any] = getattr(owner, name)
    calls_made = [0]

    def faulty(*args: Any, **kwargs: Any) -> Any:
        calls_made[0] += 1
        if calls_made[0] == on_call:
            raise RuntimeError("a fault nobody expected")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, faulty)
    return calls_made


async def _nothing_held(*regions: Local, engines: list[str]) -> None:
    async def idle() -> bool:
        loads = [await sim_load(url) for url in engines]
        return all(r.idle() for r in regions) and not any(loads)

    await eventually(idle, within_s=10)


FAULTS = {
    # the worker chosen, its slot taken, nothing sent yet (the critical finding's place)
    "before the engine is called": (requests.Inference, "upstream_body", 1, False),
    # the engine answered; its answer is being read
    "on the engine's answer": (calls, "body_usage", 1, False),
    # a stream whose head the client has
    "in the middle of a stream": (StreamMeter, "feed", 2, True),
    # the decision made, no slot yet
    "between routing and dispatch": (Router, "record", 1, False),
}


@pytest.mark.parametrize("where", list(FAULTS))
async def test_a_fault_of_ours_is_an_openai_500_and_leaves_nothing_held(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, name, on_call, stream = FAULTS[where]
    async with (
        running_sim(model=MODEL) as sim,
        local_gateway(config_of("r", [sim.url])) as r,
        _client(r) as http,
    ):
        assert (await http.post("/v1/chat/completions", json=_chat())).status_code == 200
        tokens_before = r.tokens_left()
        _fails_once(monkeypatch, owner, name, on_call)
        sent = _chat(stream)
        headers = {"X-Request-ID": "faulty-1"}
        async with http.stream("POST", "/v1/chat/completions", json=sent, headers=headers) as a:
            events = await sse(a) if stream else []
            body = await a.aread() if not stream else b""
        tokens_after = r.tokens_left()
        await _nothing_held(r, engines=[sim.url])
        again = await http.post("/v1/chat/completions", json=_chat(stream))
    assert a.headers["x-request-id"] == "faulty-1"
    if stream:  # the head went out: the stream ends with an error event
        assert a.status_code == 200
        errors = [e for e in events if isinstance(e, dict) and "error" in e]
        assert errors[-1]["error"]["code"] == "internal_error"
        assert events[-1] == "[DONE]"
    else:
        assert a.status_code == 500
        error = httpx.Response(500, content=body).json()["error"]
        assert error["code"] == "internal_error"
        assert error["type"] == "api_error"
        assert tokens_after >= tokens_before  # the prompt's tokens came back
    assert r.gateway.books.faults[MODEL] == 1
    assert again.status_code == 200


async def test_a_fault_on_the_escalation_path_leaves_no_peer_slot_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gone = f"http://127.0.0.1:{free_port()}"  # a's only engine is not there: a escalates
    async with (
        running_sim(model=MODEL) as sim,
        escalating_pair([gone], [sim.url]) as (a, b),
        _client(a) as http,
    ):
        served = await http.post("/v1/chat/completions", json=_chat())
        _fails_once(monkeypatch, forward, "body_usage")
        failed = await http.post("/v1/chat/completions", json=_chat())
        await _nothing_held(a, b, engines=[sim.url])
        started = time.monotonic()
        again = await http.post("/v1/chat/completions", json=_chat())
        streamed_fault = _fails_once(monkeypatch, forward, "relay_stream")
        async with http.stream("POST", "/v1/chat/completions", json=_chat(True)) as broken:
            await broken.aread()
        await _nothing_held(a, b, engines=[sim.url])
        after_stream_fault = await http.post("/v1/chat/completions", json=_chat())
    assert served.headers["x-meridian-region"] == "b"
    assert failed.status_code == 500
    assert failed.json()["error"]["code"] == "internal_error"
    assert again.status_code == 200  # the peer was not shunned for a fault of a's
    assert again.headers["x-meridian-region"] == "b"
    assert time.monotonic() - started < 5
    assert streamed_fault == [1]
    assert broken.status_code == 500
    assert after_stream_fault.status_code == 200


async def test_a_client_that_leaves_at_any_moment_leaves_nothing_held() -> None:
    async with running_sim(model=MODEL) as sim, local_gateway(config_of("r", [sim.url])) as r:
        for delay_s in (0.0, 0.005, 0.02, 0.05, 0.1):
            async with httpx.AsyncClient(base_url=r.url, headers=AUTH, timeout=10) as http:
                for stream in (False, True):
                    request = http.post("/v1/chat/completions", json=_chat(stream) | {
                        "max_tokens": 200})  # fmt: skip
                    task = asyncio.ensure_future(request)
                    await asyncio.sleep(delay_s)
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
        await _nothing_held(r, engines=[sim.url])
        async with httpx.AsyncClient(base_url=r.url, headers=AUTH, timeout=10) as http:
            again = await http.post("/v1/chat/completions", json=_chat())
    assert again.status_code == 200


async def test_a_request_its_quota_refuses_holds_no_place_among_its_tenants() -> None:
    """Refused by its tenant's quota before anything else is taken, a request leaves no place
    held in fair admission: a place left would count against the tenant (and inflate the
    load every later answer is judged at) for as long as the gateway runs."""
    async with running_sim(model=MODEL) as sim:
        tenant = replace(TENANT, requests_per_minute=1.0)
        config = config_of("r", [sim.url], tenants={TENANT.name: tenant})
        keys = {h: replace(k, tenant=tenant) if k.tenant.name == TENANT.name else k
                for h, k in config.keys.items()}  # fmt: skip
        config = replace(config, keys=keys)
        async with local_gateway(config) as region, _client(region) as client:
            codes = [(await client.post("/v1/chat/completions", json=_chat())).status_code
                     for _ in range(3)]  # fmt: skip
            assert codes[0] == 200
            assert codes.count(429) == 2
            await _nothing_held(region, engines=[sim.url])
