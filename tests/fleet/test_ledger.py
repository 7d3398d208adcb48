"""The usage ledger on real processes: a control plane on PostgreSQL and a region's agent with
simulated engines. Every request a client saw answered has exactly one record, with the
tokens its answer reported; a refusal has one of no tokens; through the control plane killed
-9 (the agent journals meanwhile) and the agent killed -9 under traffic (it ships what it
journaled when it is back). Each is priced at the price in effect when it started, less its
tenant's discount: a price change made through the admin API applies from its time on."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from meridian.procs import ControlPlane, start_control_plane, stop_child
from tests.kits.agents import start_agent
from tests.kits.controlplane import ADMIN_TOKEN, kek_file
from tests.kits.fleet import LLAMA, OPERATOR, Fleet, fleet_of
from tests.kits.push import ADMIN
from tests.kits.services import sql

REGION = "us-east"
Seen = dict[str, tuple[int, int] | None]  # request id: (prompt, completion) tokens, or refused


async def _ask(client: openai.AsyncOpenAI, rid: str, n: int, seen: Seen) -> None:
    """One request: streamed or not, to the model or to one that does not exist (refused)."""
    headers = {"X-Request-ID": rid}
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": f"question {n} " * (1 + n % 7)}
    ]
    try:
        if n % 10 == 9:
            await client.chat.completions.create(model="no-such-model", messages=messages,
                                                 extra_headers=headers)  # fmt: skip
        elif n % 2:
            stream = await client.chat.completions.create(
                model=LLAMA, messages=messages, max_tokens=4 + n % 5, stream=True,
                stream_options={"include_usage": True}, extra_headers=headers,
            )  # fmt: skip
            async for chunk in stream:
                if chunk.usage is not None:
                    seen[rid] = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
        else:
            answer = await client.chat.completions.create(
                model=LLAMA, messages=messages, max_tokens=4 + n % 5, extra_headers=headers
            )
            assert answer.usage is not None
            seen[rid] = answer.usage.prompt_tokens, answer.usage.completion_tokens
    except openai.NotFoundError:
        seen[rid] = None
    except (openai.APIConnectionError, openai.APIStatusError):
        pass  # cut by a kill: recorded once, or not at all


async def _traffic(fleet: Fleet, prefix: str, count: int, seen: Seen, pace_s: float) -> None:
    client = fleet.client(REGION)
    tasks = []
    for n in range(count):
        tasks.append(asyncio.create_task(_ask(client, f"{prefix}-{n}", n, seen)))
        await asyncio.sleep(pace_s)
    await asyncio.gather(*tasks)
    await client.close()


async def _records(url: str) -> list[tuple[Any, ...]]:
    return await sql(url, "SELECT request_id, kind, prompt_tokens, completion_tokens, outcome, "
                     "cached_tokens, started_at, cost_nanos FROM usage_records")  # fmt: skip


def _priced(doc: dict[str, Any]) -> None:
    llama = next(m for m in doc["models"] if m["name"] == LLAMA)
    llama["pricing"] = {"prices": [{"effective_from": "2026-01-01T00:00:00Z", "input": 0.15,
                                    "cached_input": 0.075, "output": 0.6}]}  # fmt: skip
    next(t for t in doc["tenants"] if t["name"] == "acme")["price_discount_percent"] = 10


async def _new_price(fleet: Fleet, at: datetime) -> None:
    """From `at` on, input at 0.3 and output at 1.2 per million tokens."""
    async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN) as http:
        model = (await http.get(f"/v1/models/{LLAMA}")).json()
        later = {"effective_from": at.isoformat(), "input": 0.3, "output": 1.2}
        model["pricing"]["prices"].append(later)
        answer = await http.put(f"/v1/models/{LLAMA}", json=model,
                                headers={"If-Match": f'"{model["version"]}"'})  # fmt: skip
        assert answer.status_code == 200, answer.text


def _cost(prompt: int, cached: int, completion: int, new: bool) -> int:
    """In billionths of a dollar, 10% off: a token at $x per million costs 1000x of them."""
    if new:
        nanos = prompt * 300 + completion * 1200
    else:
        nanos = (prompt - cached) * 150 + cached * 75 + completion * 600
    return round(nanos * 0.9)


@pytest.mark.alone  # kills and restarts: timed waits beside other tests' load would stretch
async def test_every_answer_is_recorded_once_through_kills_of_the_control_plane_and_agent(
    database_url: str, tmp_path: Path
) -> None:
    seen: Seen = {}
    restarted: ControlPlane | None = None
    async with fleet_of(database_url, tmp_path, regions=(REGION,), change=_priced) as fleet:
        try:
            change = datetime.now(UTC) + timedelta(seconds=3)
            await _new_price(fleet, change)
            await _traffic(fleet, "calm", 60, seen, 0.02)
            await asyncio.sleep(max(0.0, (change - datetime.now(UTC)).total_seconds()))
            # the control plane killed -9: the agent serves and journals
            grpc_port = int(fleet.cp.grpc_target.rsplit(":", 1)[1])
            await fleet.kill_control_plane()
            await _traffic(fleet, "away", 40, seen, 0.02)
            restarted = await start_control_plane(
                {"MERIDIAN_DATABASE_URL": database_url, "MERIDIAN_ADMIN_TOKEN": ADMIN_TOKEN,
                 "MERIDIAN_LOG_LEVEL": "warning", "MERIDIAN_KMS_KEY_FILE": kek_file(database_url)},
                port=urlsplit(fleet.cp.url).port, grpc_port=grpc_port, timeout_s=60,
            )  # fmt: skip
            # the agent killed -9 under traffic, and started again on its disk
            agent = fleet.agents[REGION]
            traffic = asyncio.create_task(_traffic(fleet, "kill", 80, seen, 0.02))
            await asyncio.sleep(0.8)
            os.kill(agent.process.pid, signal.SIGKILL)
            await agent.process.wait()
            await traffic
            fleet.agents[REGION] = await start_agent(
                fleet.cp.grpc_target, REGION, tmp_path / REGION, node=f"{REGION}-1",
                operator=OPERATOR, port=urlsplit(agent.url).port,
                env={"MERIDIAN_AGENT_CONTROL_PLANE_URL": fleet.cp.url},
            )  # fmt: skip
            await _traffic(fleet, "back", 20, seen, 0.02)
            expected = set(seen)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while not expected <= (stored := {r[0] for r in await _records(database_url)}):
                if loop.time() > deadline:  # which phase's records never came, to tell why
                    missing = Counter(rid.rsplit("-", 1)[0] for rid in expected - stored)
                    pytest.fail(f"not stored within 60 s, by phase: {dict(missing)}; "
                                f"{len(stored)} records stored of {len(expected)}")  # fmt: skip
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)  # anything sent twice would be stored by now
            records = await _records(database_url)
        finally:
            if restarted is not None:
                await stop_child(restarted.process)
    ids = [r[0] for r in records]
    assert len(ids) == len(set(ids)), "a request recorded twice"
    by_id = {r[0]: r for r in records}
    assert sum(1 for rid in seen if rid.startswith("kill")) >= 20  # the kill cut some, not all
    assert sum(1 for v in seen.values() if v is None) >= 10
    prices = {False: 0, True: 0}  # records at the first price, and at the new one
    for rid, tokens in seen.items():
        _, kind, prompt, completion, outcome, cached, started, cost = by_id[rid]
        if tokens is None:
            assert (kind, prompt, completion, outcome, cost) == (
                "refused", 0, 0, "model_not_found", 0)  # fmt: skip
        else:
            assert (kind, (prompt, completion), outcome) == ("served", tokens, "ok"), rid
            new = started >= change
            prices[new] += 1
            assert cost == _cost(prompt, cached, completion, new), rid
    assert min(prices.values()) >= 40  # both prices were in effect for many
