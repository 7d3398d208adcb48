"""The usage ledger across regions, on real processes: us-east serves, then its engines are
killed -9 and it escalates to us-west. Every request has exactly one record that is not a
hop: the region that served it records it, with the client's API key (the escalation's
signed word), and the region that escalated records only the hop. Clients that leave
mid-stream are charged, as an estimate, for what they got."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.kits.fleet import LLAMA, Fleet, fleet_of
from tests.kits.services import sql

Seen = dict[str, tuple[int, int] | str | None]  # request id: tokens, "left" or None (refused)


async def _ask(client: openai.AsyncOpenAI, rid: str, n: int, seen: Seen) -> None:
    headers = {"X-Request-ID": rid}
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": f"q {n} " * 5}]
    try:
        if n % 10 == 9:
            await client.chat.completions.create(model="no-such-model", messages=messages,
                                                 extra_headers=headers)  # fmt: skip
        elif n % 10 == 7:  # leaves after two chunks
            stream = await client.chat.completions.create(
                model=LLAMA, messages=messages, max_tokens=40, stream=True, extra_headers=headers
            )
            got = 0
            async for _ in stream:
                got += 1
                if got == 3:
                    break
            await stream.close()
            seen[rid] = "left"
        else:
            answer = await client.chat.completions.create(
                model=LLAMA, messages=messages, max_tokens=3 + n % 4, extra_headers=headers
            )
            assert answer.usage is not None
            seen[rid] = answer.usage.prompt_tokens, answer.usage.completion_tokens
    except openai.NotFoundError:
        seen[rid] = None
    except openai.APIError:
        pass  # cut by the kill: recorded once, or not at all


async def _traffic(fleet: Fleet, prefix: str, count: int, seen: Seen) -> None:
    client = fleet.client("us-east")
    tasks = []
    for n in range(count):
        tasks.append(asyncio.create_task(_ask(client, f"{prefix}-{n}", n, seen)))
        await asyncio.sleep(0.02)
    await asyncio.gather(*tasks)
    await client.close()


async def _records(url: str) -> list[dict[str, Any]]:
    names = ("request_id", "kind", "region", "came_from", "escalated_to", "api_key",
             "prompt_tokens", "completion_tokens", "outcome", "estimated")  # fmt: skip
    rows = await sql(url, f"SELECT {', '.join(names)} FROM usage_records")  # noqa: S608
    return [dict(zip(names, row, strict=True)) for row in rows]


@pytest.mark.alone  # engines killed under traffic: timed waits beside other tests would stretch
async def test_each_request_has_one_record_where_it_was_served(
    database_url: str, tmp_path: Path
) -> None:
    seen: Seen = {}
    async with fleet_of(database_url, tmp_path, ("us-east", "us-west")) as fleet:
        prefix = fleet.keys["acme"].split(".", 1)[0]
        await _traffic(fleet, "home", 80, seen)
        await fleet.kill_engines("us-east")
        await asyncio.sleep(0.5)
        await _traffic(fleet, "away", 80, seen)
        try:
            async with asyncio.timeout(30):
                while not set(seen) <= {r["request_id"] for r in await _records(database_url)}:  # noqa: ASYNC110 (other processes' rows)
                    await asyncio.sleep(0.2)
        except TimeoutError:
            have = {r["request_id"] for r in await _records(database_url)}
            missing = sorted(set(seen) - have)
            raise AssertionError(f"no record of {missing}: {[seen[m] for m in missing]}") from None
        await asyncio.sleep(1.0)
        records = await _records(database_url)
    by_request: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_request.setdefault(record["request_id"], []).append(record)
    escalated = 0
    for rid, outcome in seen.items():
        mine = by_request[rid]
        charged = [r for r in mine if r["kind"] != "hop"]
        assert len(charged) == 1, (rid, mine)  # one record that is not a hop: charged once
        (record,) = charged
        assert record["api_key"] == prefix, record  # the client's key, wherever it ran
        hops = [r for r in mine if r["kind"] == "hop"]
        if record["region"] == "us-west":  # escalated: us-east recorded only the hop
            escalated += 1
            assert record["came_from"] == "us-east"
            assert [(h["region"], h["escalated_to"], h["completion_tokens"]) for h in hops] == [
                ("us-east", "us-west", 0)]  # fmt: skip
        else:
            assert hops == []
        if outcome is None:
            assert (record["kind"], record["completion_tokens"]) == ("refused", 0)
        elif outcome == "left":  # charged for what it got, as an estimate
            assert (record["kind"], record["estimated"]) == ("served", True), record
            assert 1 <= record["completion_tokens"] <= 40
        else:
            assert (record["prompt_tokens"], record["completion_tokens"]) == outcome, rid
    assert escalated >= 10  # after the kill, until its engines are back
