"""Meridian on the real SGLang 0.5.23, run on the CPU with the tiny model the project makes:
an agent supervises two engines to ready, its gateway serves through its router, the load
poll and the KV events see what the engines do, the quality guard's canary scores them on
the real /generate, a drain fails nothing, and a stream whose engine dies is finished by the
other. One region for the module (its engines start once); the tests run in this order."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio

from agents.engines import sglang_env
from tests.kits.push import eventually
from tests.sglang.kit import MODEL, REGION, RealRegion, real_region, route

# Real engines on the CPU: run with nothing beside them (scripts/test runs the rest in
# parallel first), since what they measure takes the CPU they would share.
pytestmark = pytest.mark.alone


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def region(
    module_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RealRegion]:
    async with real_region(module_database_url, tmp_path_factory.mktemp("real-sglang")) as found:
        yield found


async def test_an_agent_runs_two_real_engines_to_ready(region: RealRegion) -> None:
    engines = await region.ready(2)
    for engine in engines:
        assert engine["backend"] == "sglang"
        assert engine["version"] == sglang_env.SGLANG_VERSION  # the engine's own word
        # its load, from its /v1/loads (a canary may be running on it already)
        assert engine["running_requests"] in (0, 1)
        assert engine["waiting_requests"] == 0
        notes = " ".join(engine["notes"])
        assert "cpu" in notes
        assert "stand-in" in notes  # the CUDA-only sgl_kernel does not load here


def _client(region: RealRegion) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{region.url}/v1", api_key=region.key, max_retries=0)


ASK: Any = [{"role": "user", "content": "Tell me a story about the river and the city."}]


async def test_the_gateway_serves_chat_and_completions_streamed_or_not(region: RealRegion) -> None:
    client = _client(region)
    chat = await client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=12, temperature=0
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage is not None
    assert 0 < chat.usage.completion_tokens <= 12
    assert chat.choices[0].finish_reason in ("length", "stop")

    stream = await client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=12, stream=True, temperature=0,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = [chunk async for chunk in stream]
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] in ("length", "stop")  # in a final chunk of its own, on 0.5.23
    assert all(r is None for r in reasons[:-1])
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens == chat.usage.completion_tokens
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat.choices[0].message.content  # greedy: the same answer either way

    done = await client.completions.create(
        model=MODEL, prompt="The quick brown fox", max_tokens=8, temperature=0
    )
    assert done.usage is not None
    assert 0 < done.usage.completion_tokens <= 8
    pieces = await client.completions.create(
        model=MODEL, prompt="The quick brown fox", max_tokens=8, stream=True, temperature=0
    )
    streamed = "".join([c.choices[0].text async for c in pieces if c.choices])
    assert streamed == done.choices[0].text


async def test_load_polling_sees_the_engines_running_requests(region: RealRegion) -> None:
    client = _client(region)

    async def one() -> int:
        answer = await client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=100, extra_body={"ignore_eos": True}
        )
        assert answer.usage is not None
        return answer.usage.completion_tokens

    calls = [asyncio.create_task(one()) for _ in range(6)]
    seen: dict[str, int] = {}
    try:
        while not all(c.done() for c in calls):
            workers = (await region.agent.status())["router"]["workers"]
            for worker, learned in workers.items():
                polled = learned["engine"]
                if polled is not None:
                    seen[worker] = max(seen.get(worker, 0), int(polled["running"]))
                    assert polled["kv_capacity"] > 0  # the engine's KV pool, as it says
            await asyncio.sleep(0.1)
    finally:
        tokens = await asyncio.gather(*calls)
    assert tokens == [100] * 6
    assert sum(seen.values()) >= 2, seen  # both engines polled busy, or one with several


async def _subscribed(region: RealRegion) -> dict[str, int]:
    """Both engines' KV events heard, from the root (each flushed once its early events were
    found missing)."""

    async def probe() -> dict[str, int] | None:
        events: dict[str, int] = (await region.agent.status())["router"]["kv_events"]
        return events if len(events) == 2 and all(n > 0 for n in events.values()) else None

    found: dict[str, int] = await eventually(probe, within_s=60, every_s=0.5)
    return found


async def test_kv_events_send_a_shared_prefix_to_the_engine_that_holds_it(
    region: RealRegion,
) -> None:
    await _subscribed(region)
    shared = " ".join(f"river {i} city {i * 7} and the old man" for i in range(40))
    url = f"{region.url}/v1/chat/completions"

    async def ask(http: httpx.AsyncClient, question: str) -> tuple[dict[str, Any], Any]:
        body = {"model": MODEL, "max_tokens": 2, "messages": [
            {"role": "user", "content": f"{shared}. {question}"}]}  # fmt: skip
        answer = await http.post(url, json=body, headers=region.headers(debug=True))
        assert answer.status_code == 200, answer.text
        asked.append(answer.headers["x-request-id"])
        return route(answer), answer.json()["usage"]

    asked: list[str] = []

    def matched(decided: dict[str, Any]) -> int:
        chosen = next(c for c in decided["candidates"] if c["worker"] == decided["worker"])
        return int(chosen["matched_tokens"])

    async with httpx.AsyncClient(timeout=60) as http:
        first, first_usage = await ask(http, "What did he see?")
        # its BlockStored events land; and a receipt is kept a second at most
        await asyncio.sleep(1.2)
        second, usage = await ask(http, "Where did he go?")
        receipt = await _receipt(region, asked[-1])
    # new but for the chat template's head, which earlier requests left in both caches
    assert matched(first) < first_usage["prompt_tokens"] // 10
    assert second["worker"] == first["worker"]
    # the router knew the prefix was there from the engine's own events, and it was
    assert matched(second) > first_usage["prompt_tokens"] // 2
    assert usage["prompt_tokens_details"]["cached_tokens"] > first_usage["prompt_tokens"] // 2
    # and the route's receipt, on the control plane's status, says so
    said = re.search(r"(\d+) of (\d+) tokens cached", receipt["reason"])
    assert said is not None, receipt
    assert int(said[1]) == matched(second)


async def _receipt(region: RealRegion, request_id: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        receipts = (await region.admin("GET", "/v1/status")).get("receipts", [])
        return next((r for r in receipts if r["request_id"] == request_id), None)

    found: dict[str, Any] = await eventually(probe, within_s=30, every_s=0.5)
    return found


async def test_the_canary_scores_both_engines_by_teacher_forced_logprobs(
    region: RealRegion,
) -> None:
    async def scored() -> dict[str, Any] | None:
        quality = (await region.agent.status())["quality"]
        canaries = quality["models"].get(MODEL, {}).get("canaries", [])
        both = [c for c in canaries if c["workers"] == 2]
        return quality if both else None

    quality = await eventually(scored, within_s=90, every_s=1)
    for canary in quality["models"][MODEL]["canaries"]:
        # a real mean log-probability of the reference under the tiny model's random weights
        assert -20 < canary["score"] < 0, canary
    assert quality["held"] == []  # two engines of the same weights agree: none quarantined


async def test_a_stream_whose_engine_is_killed_finishes_on_the_other(region: RealRegion) -> None:
    body = {"model": MODEL, "messages": ASK, "max_tokens": 400, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
    events: list[Any] = []
    async with (
        httpx.AsyncClient(timeout=120) as http,
        http.stream("POST", f"{region.url}/v1/chat/completions", json=body,
                    headers=region.headers(debug=True)) as response,
    ):  # fmt: skip
        assert response.status_code == 200
        victim = route(response)["worker"]
        pid = next(e["pid"] for e in await region.engines() if e["id"] == victim)
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line.removeprefix("data: "))
            if len(events) == 20:
                os.kill(pid, signal.SIGKILL)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks), chunks[-3:]
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 400  # one answer, whole, across two engines
    await region.ready(2)  # the killed engine is started again


async def test_a_drain_stops_an_engine_without_failing_its_requests(region: RealRegion) -> None:
    client = _client(region)

    async def one() -> int:
        stream = await client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=250, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        chunks = [chunk async for chunk in stream]
        assert chunks[-1].usage is not None
        return chunks[-1].usage.completion_tokens

    calls = [asyncio.create_task(one()) for _ in range(4)]
    await asyncio.sleep(1.0)  # all four under way, on both engines
    await region.admin("PATCH", f"/v1/deployments/{MODEL}-{REGION}", {"replicas": 1})
    tokens = await asyncio.gather(*calls)
    assert tokens == [250] * 4
    await region.ready(1)
