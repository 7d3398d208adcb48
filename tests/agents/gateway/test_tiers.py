"""Tiered routes in a region's gateway, over real simulated engines: `chat-auto` is answered by
`small` (fast) or `large` (4x slower a token). Easy requests go to the cheap tier and hard
ones to the strong one by the classifier's table, which an operator's table replaces; a
tenant that did not opt in always gets the strong tier; under a saturated strong pool an
opted-in tenant's request moves down and is served within the SLO, while another tenant's
waits for the strong tier or is refused, never moved; a cascade asks the strong tier once on
each failure signal; a conversation keeps its tier; an external classifier past its budget
does not hold the request."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any

import httpx
import orjson
from aiohttp import web
from meridian_pb.fleet.v1.features import Table, default_table
from meridian_pb.fleet.v1.params import CostParams

from agents.config import (
    ApiKey,
    Cascade,
    ModelConfig,
    RegionConfig,
    RouteConfig,
    Tenant,
    TieredRouteConfig,
    WorkerSpec,
)
from meridian.procs import free_port
from tests.kits.inproc import Local, local_gateway
from tests.kits.sim import Sim, running_sim

ROUTE = "chat-auto"
OPTED = Tenant("acme", "standard", None, None, None, tiering=True)
PLAIN = Tenant("plain", "standard", None, None, None)
FLOORED = Tenant("floored", "standard", None, None, None, tiering=True, tier_floor="large")
BETA = Tenant("beta", "standard", None, None, None, tiering=True)  # opted in, like acme
TENANTS = (OPTED, PLAIN, FLOORED, BETA)
KEYS = {t.name: f"sk-tiers-{t.name}-0123456789" for t in TENANTS}
EASY = "What is the capital of France?"
HARD = "```python\ndef solve(xs):\n    return sorted(xs)\n```\nMake this faster and prove it."
MARK = "weak"  # the cheap engines' --fail-marker
SLO_S = 1.0  # both tiers' TTFT SLO


def _config(small: list[Sim], large: list[Sim], **changes: Any) -> RegionConfig:
    workers = tuple(
        WorkerSpec(f"{model}-{i}", model, model, "unified", sim.url, None)
        for model, sims in (("small", small), ("large", large))
        for i, sim in enumerate(sims)
    )
    both = frozenset({"chat", "completion", "tools"})
    config = RegionConfig(
        revision=1, digest="d", region="r", cloud="c", jurisdiction="us",
        models={m: ModelConfig(m, 8192, both) for m in ("small", "large")},
        routes={m: RouteConfig(m, "cost", CostParams(), SLO_S, None, None, 64)
                for m in ("small", "large")},
        workers=workers,
        keys={hashlib.sha256(KEYS[t.name].encode()).hexdigest(): ApiKey(t, t.name[:8], None)
              for t in TENANTS},
        tenants={t.name: t for t in TENANTS},
        tiered={ROUTE: TieredRouteConfig(ROUTE, ("small", "large"), default_table(2))},
    )  # fmt: skip
    return replace(config, **changes)


@contextlib.asynccontextmanager
async def _region(
    small: int = 1, large: int = 1, large_args: tuple[str, ...] = ()
) -> AsyncIterator[tuple[Local, list[Sim], list[Sim]]]:
    async with AsyncExitStack() as stack:
        smalls = [
            await stack.enter_async_context(running_sim("--fail-marker", MARK, model="small"))
            for _ in range(small)
        ]
        larges = [await stack.enter_async_context(
            running_sim("--speed-factor", "0.25", *large_args, model="large"))
            for _ in range(large)]  # fmt: skip
        region = await stack.enter_async_context(local_gateway(_config(smalls, larges)))
        yield region, smalls, larges


async def _chat(
    http: httpx.AsyncClient,
    region: Local,
    tenant: Tenant,
    content: str | list[dict[str, str]],
    **extra: Any,
) -> httpx.Response:
    messages = [{"role": "user", "content": content}] if isinstance(content, str) else content
    body = {"model": ROUTE, "messages": messages, "max_tokens": 8, **extra}
    headers = {"Authorization": f"Bearer {KEYS[tenant.name]}"}
    return await http.post(f"{region.url}/v1/chat/completions", json=body, headers=headers)


def _tier(answer: httpx.Response) -> tuple[str, str]:
    """The model that answered (the answer's `model`, which its header must name too) and why."""
    assert answer.status_code == 200, answer.text
    header = answer.headers["x-meridian-tier"]
    model = answer.json()["model"]
    assert header.startswith(f"{model}; tier="), (header, model)
    return model, header.split("why=", 1)[1]


async def test_easy_and_hard_requests_go_to_their_tiers_and_an_operators_table_changes_it() -> None:
    async with _region() as (region, _, _), httpx.AsyncClient(timeout=30) as http:
        listed = (
            await http.get(
                f"{region.url}/v1/models", headers={"Authorization": f"Bearer {KEYS['acme']}"}
            )
        ).json()
        assert {"id": ROUTE, "tiers": ["small", "large"]}.items() <= next(
            m for m in listed["data"] if m["id"] == ROUTE).items()  # fmt: skip
        assert _tier(await _chat(http, region, OPTED, EASY))[0] == "small"
        model, why = _tier(await _chat(http, region, OPTED, HARD))
        assert (model, why.split(" ")[0]) == ("large", "difficulty")
        tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
        assert _tier(await _chat(http, region, OPTED, EASY, tools=tools))[0] == "small"
        effort = await _chat(http, region, OPTED, EASY, reasoning_effort="high")
        assert _tier(effort)[0] == "large"
        # a tenant that did not opt in gets the strongest tier; a floor is never gone below
        assert _tier(await _chat(http, region, PLAIN, EASY)) == ("large", "not opted in")
        assert _tier(await _chat(http, region, FLOORED, EASY)) == ("large", "floor")
        # the operator's table: everything short of a long prompt is cheap
        table = Table(-1.0, {"prompt_tokens_log2": 0.2}, (0.5,))
        route = TieredRouteConfig(ROUTE, ("small", "large"), table)
        region.gateway.configure(replace(region.config, tiered={ROUTE: route}))
        assert _tier(await _chat(http, region, OPTED, HARD))[0] == "small"
        long = " ".join(f"word{i}" for i in range(3000))
        assert _tier(await _chat(http, region, OPTED, long))[0] == "large"
        counted = region.gateway.books.tier_answered
        assert counted[ROUTE, "small", "difficulty"] == 3
        assert counted[ROUTE, "large", "not opted in"] == 1
        # a tier whose model does not take what the request needs is passed over
        plain = frozenset({"chat", "completion"})
        models = {**region.config.models, "large": ModelConfig("large", 8192, plain)}
        region.gateway.configure(replace(region.config, models=models))
        assert _tier(await _chat(http, region, OPTED, HARD, tools=tools))[0] == "small"
        assert _tier(await _chat(http, region, OPTED, HARD))[0] == "large"


async def test_under_a_saturated_strong_pool_only_opted_in_tenants_move_down() -> None:
    async with (
        _region(large_args=("--max-running-requests", "1")) as (region, _, _),
        httpx.AsyncClient(timeout=60) as http,
    ):
        # fill the strong pool: long answers, one at a time, straight to `large`
        operator = {"Authorization": "Bearer operator-token-0123456789"}
        body = {"model": "large", "messages": [{"role": "user", "content": "go on"}],
                "max_tokens": 400, "ignore_eos": True}  # fmt: skip
        flood = [asyncio.ensure_future(http.post(f"{region.url}/v1/chat/completions",
                                                 json=body, headers=operator))
                 for _ in range(4)]  # fmt: skip
        try:
            await asyncio.sleep(1.5)  # the strong pool is busy, its queue growing
            began = time.monotonic()
            moved = await _chat(http, region, OPTED, HARD)
            took = time.monotonic() - began
            model, why = _tier(moved)
            assert model == "small", why
            assert why.startswith("capacity (moved down: large"), why
            assert took < SLO_S, f"moved down, yet {took:.2f} s past the {SLO_S} s SLO"
            plain = await _chat(http, region, PLAIN, HARD)
            if plain.status_code == 200:
                assert _tier(plain)[0] == "large"
            else:  # the strong tier or a refusal, never a silent downgrade
                assert plain.status_code == 429, plain.text
            moves = region.gateway.books.tier_moves
            assert moves[ROUTE, "large", "small", "capacity"] == 1
        finally:
            for request in flood:
                request.cancel()
            await asyncio.gather(*flood, return_exceptions=True)


async def test_a_cascade_asks_the_strong_tier_once_on_each_failure_signal() -> None:
    async with _region() as (region, _, _), httpx.AsyncClient(timeout=30) as http:
        cascade = Cascade(frozenset({"invalid_json", "tool_schema", "length", "low_logprob"}),
                          -1.5, False)  # fmt: skip
        route = TieredRouteConfig(ROUTE, ("small", "large"), default_table(2), cascade=cascade)
        region.gateway.configure(replace(region.config, tiered={ROUTE: route}))
        tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
            "type": "object", "properties": {"q": {"type": "string"}}}}}]  # fmt: skip
        asks: dict[str, dict[str, Any]] = {
            "invalid_json": {"response_format": {"type": "json_object"}},
            "tool_schema": {"tools": tools},
            "length": {},
            "low_logprob": {},
        }
        way = {"invalid_json": "json", "tool_schema": "tool", "length": "length",
               "low_logprob": "logprob"}  # fmt: skip
        for signal, extra in asks.items():
            answer = await _chat(http, region, OPTED, f"{EASY} {MARK}:{way[signal]}", **extra)
            model, why = _tier(answer)
            assert (model, why) == ("large", f"cascade (small: {signal})"), answer.headers
            assert answer.json()["choices"][0]["logprobs"] is None  # the client asked none
            assert region.gateway.books.cascades[ROUTE, signal] == 1
        # an answer that shows no signal stands, without the log-probabilities asked for it
        plain = await _chat(http, region, OPTED, EASY, response_format={"type": "json_object"})
        assert _tier(plain)[0] == "small"
        assert plain.json()["choices"][0]["logprobs"] is None
        assert sum(region.gateway.books.cascades.values()) == 4
        # asked of the strongest once: a strong answer that shows a signal too is the answer
        strong_too = await _chat(http, region, OPTED, HARD + f" {MARK}:length")
        assert _tier(strong_too)[0] == "large"
        assert sum(region.gateway.books.cascades.values()) == 4


async def test_a_buffered_stream_is_judged_whole_then_streamed_or_cascaded() -> None:
    async with _region() as (region, _, _), httpx.AsyncClient(timeout=30) as http:
        cascade = Cascade(frozenset({"length"}), -1.5, True)
        route = TieredRouteConfig(ROUTE, ("small", "large"), default_table(2), cascade=cascade)
        region.gateway.configure(replace(region.config, tiered={ROUTE: route}))
        usage = {"stream": True, "stream_options": {"include_usage": True}}
        for prompt, model in ((EASY, "small"), (f"{EASY} {MARK}:length", "large")):
            answer = await _chat(http, region, OPTED, prompt, **usage)
            assert answer.status_code == 200, answer.text
            assert answer.headers["content-type"].startswith("text/event-stream")
            assert answer.headers["x-meridian-tier"].startswith(f"{model}; ")
            events = [orjson.loads(line[6:]) for line in answer.text.splitlines()
                      if line.startswith("data: {")]  # fmt: skip
            assert answer.text.rstrip().endswith("data: [DONE]")
            assert {e["model"] for e in events} == {model}
            text = "".join(str(e["choices"][0]["delta"].get("content") or "")
                           for e in events if e["choices"])  # fmt: skip
            assert text.strip()
            assert events[-1]["usage"]["completion_tokens"] == 8
        assert region.gateway.books.cascades[ROUTE, "length"] == 1


async def test_a_conversation_stays_on_its_tier_and_goes_up_when_a_turn_is_harder() -> None:
    async with _region() as (region, _, _), httpx.AsyncClient(timeout=30) as http:
        first = await _chat(http, region, OPTED, HARD)
        assert _tier(first)[0] == "large"
        said = first.json()["choices"][0]["message"]["content"]
        turns = [{"role": "user", "content": HARD}, {"role": "assistant", "content": said},
                 {"role": "user", "content": "thanks!"}]  # fmt: skip
        second = await _chat(http, region, OPTED, turns)
        assert _tier(second) == ("large", "conversation")
        # an easy conversation is cheap until a turn is hard; then it stays up
        easy = await _chat(http, region, OPTED, EASY)
        assert _tier(easy)[0] == "small"
        talk = [{"role": "user", "content": EASY},
                {"role": "assistant", "content": easy.json()["choices"][0]["message"]["content"]},
                {"role": "user", "content": HARD}]  # fmt: skip
        harder = await _chat(http, region, OPTED, talk)
        assert _tier(harder)[0] == "large"
        said = harder.json()["choices"][0]["message"]["content"]
        talk += [{"role": "assistant", "content": said}, {"role": "user", "content": "ok"}]
        assert _tier(await _chat(http, region, OPTED, talk)) == ("large", "conversation")


async def test_two_tenants_identical_conversations_never_share_a_tier_decision() -> None:
    """Issue 40: acme sends the first turn of beta's conversation, asking for effort; beta's
    next turn is not moved up by it (poisoning), and which tier beta gets, and why, does not
    tell acme whether its guess of beta's words was right (an oracle)."""
    async with _region() as (region, _, _), httpx.AsyncClient(timeout=30) as http:
        mine = await _chat(http, region, BETA, EASY)
        assert _tier(mine)[0] == "small"
        said = mine.json()["choices"][0]["message"]["content"]
        # acme guesses beta's first turn exactly, with effort: its own answer is large
        guess = await _chat(http, region, OPTED, EASY, reasoning_effort="high")
        assert _tier(guess)[0] == "large"
        turns = [{"role": "user", "content": EASY}, {"role": "assistant", "content": said},
                 {"role": "user", "content": "and of Spain?"}]  # fmt: skip
        assert _tier(await _chat(http, region, BETA, turns))[0] == "small"
        # acme's follow-up of the same words gets its own conversation's tier (large: it
        # asked for effort), and beta's identical one its own (small): the same either way
        said = guess.json()["choices"][0]["message"]["content"]
        acme_turns = [*turns[:1], {"role": "assistant", "content": said}, turns[2]]
        assert _tier(await _chat(http, region, OPTED, acme_turns)) == ("large", "conversation")
        beta_first = _tier(await _chat(http, region, BETA, acme_turns))
        assert beta_first == _tier(await _chat(http, region, BETA, acme_turns))
        assert beta_first[1] != "conversation"  # beta never sent acme's answer as its own


@contextlib.asynccontextmanager
async def _classifier(delay_s: float, answer: dict[str, Any]) -> AsyncIterator[str]:
    seen: list[Any] = []

    async def classify(request: web.Request) -> web.Response:
        seen.append(await request.json())
        await asyncio.sleep(delay_s)
        return web.json_response(answer)

    app = web.Application()
    app.router.add_post("/classify", classify)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/classify"
    finally:
        await runner.cleanup()


async def test_an_external_classifier_decides_within_its_budget_and_no_later() -> None:
    async with _region() as (region, _, _), httpx.AsyncClient(timeout=30) as http:
        async with _classifier(0.0, {"tier": 1}) as url:
            route = TieredRouteConfig(ROUTE, ("small", "large"), default_table(2),
                                      external_url=url, external_budget_s=1.0)  # fmt: skip
            region.gateway.configure(replace(region.config, tiered={ROUTE: route}))
            assert _tier(await _chat(http, region, OPTED, EASY)) == ("large", "external")
        async with _classifier(3.0, {"tier": 1}) as url:
            route = replace(route, external_url=url, external_budget_s=0.05)
            region.gateway.configure(replace(region.config, tiered={ROUTE: route}))
            began = time.monotonic()
            late = await _chat(http, region, OPTED, EASY)
            took = time.monotonic() - began
            assert _tier(late)[0] == "small"  # the built-in score's choice
            assert took < 1.5, f"the request waited {took:.2f} s on a 0.05 s budget"
            assert region.gateway.books.external_late[ROUTE] == 1
