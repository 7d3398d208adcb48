"""The usage ledger across three regions, on real processes: about 2,000 requests of every kind
a tenant makes, to all three regions' agents (simulated engines), then us-east's engines
killed -9 under long streams and more traffic. Every request its client saw an answer to,
or a refusal of, is charged by exactly one record:

- a whole answer or a stream, where it was served, with the tokens its client was told;
- a refusal (an unknown model) at no cost;
- a client that left mid-stream, for what was made (its engine's count, or an estimate from
  what the client got when the engine had not said it);
- a tiered request cascaded to the strong tier, with both answers, each in its `calls`;
- a request escalated when its region had no engine left: by the peer that served it, the
  region it came to recording only the hop; a tiered one (whose answer the region it came to
  may cascade), by that region, with each answer the peer made recorded there as `carried`;
- a stream cut by the kill and carried on in a peer: by the region its client came to, the
  whole answer as its client was told it, the peer recording its part as `carried`, at no
  cost.

The usage report over the period agrees with the records to the nano."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.kits.fleet import LLAMA, Fleet, fleet_of
from tests.kits.fleet_docs import example
from tests.kits.push import ADMIN
from tests.kits.services import sql

REGIONS = ("us-east", "us-west", "eu-west")
QWEN, ROUTE = "qwen2.5-32b-instruct", "chat-auto"
MARK = "weak"  # llama's engines answer a request marked `weak:json` with what is not JSON
LONG = 300  # the tokens of a stream the kill cuts
STARTUP_S = 4.0  # us-east's engines take this long to serve once started (restarted)
Seen = dict[str, tuple[int, int] | str | None]  # id: tokens told, "left", "cut" or refused


def _tiered(doc: dict[str, Any]) -> None:
    """The example fleet's tiered route back (llama, then qwen), qwen in every region, and
    GPUs enough for both."""
    full = example()
    doc["models"].append(next(m for m in full["models"] if m["name"] == QWEN))
    doc["routing_policies"] += [p for p in full["routing_policies"] if p["model"] == QWEN]
    doc["tiered_routes"] = full["tiered_routes"]
    for deployment in doc["deployments"]:
        deployment["engine_args"] = {"fail-marker": MARK}
    doc["deployments"] += [{"name": f"qwen-{r}", "model": QWEN, "region": r, "backend": "sim",
                            "replicas": 1} for r in REGIONS]  # fmt: skip
    for deployment in doc["deployments"]:
        if deployment["region"] == "us-east":  # killed below: back only after STARTUP_S, so
            # that requests meanwhile find no engine there, however soon they come
            deployment.setdefault("engine_args", {})["startup-s"] = STARTUP_S
    for node in doc["nodes"]:
        node["gpus"] = [{"index": i, "model": "H100-SXM-80GB", "memory_gb": 80}
                        for i in range(max(4, len(node["gpus"])))]  # fmt: skip
    for pool in doc["node_pools"]:
        pool["gpus_per_node"] = max(4, pool["gpus_per_node"])


async def _ask(client: openai.AsyncOpenAI, rid: str, n: int, seen: Seen) -> None:
    headers = {"X-Request-ID": rid}
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": f"q {n} " * 5}]
    kind = n % 20
    try:
        if kind == 14:
            await client.chat.completions.create(model="no-such-model", messages=messages,
                                                 extra_headers=headers)  # fmt: skip
            return
        if kind == 15:  # leaves after three chunks
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
            return
        if kind >= 10:  # streamed, told its usage at the end
            stream = await client.chat.completions.create(
                model=ROUTE if kind >= 16 else LLAMA, messages=messages, max_tokens=4 + n % 9,
                stream=True, stream_options={"include_usage": True}, extra_headers=headers,
            )  # fmt: skip
            async for chunk in stream:
                if chunk.usage is not None:
                    seen[rid] = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
            return
        if kind >= 7:  # tiered; asked as JSON and marked: llama's answer is not, so qwen's
            cascade = kind == 7
            text = f"q {n} {MARK}:json" if cascade else f"q {n} " * 5
            answer = await client.chat.completions.create(
                model=ROUTE, messages=[{"role": "user", "content": text}], max_tokens=6,
                response_format={"type": "json_object"}, extra_headers=headers,
            )  # fmt: skip
        else:
            answer = await client.chat.completions.create(
                model=LLAMA, messages=messages, max_tokens=3 + n % 5, extra_headers=headers
            )
        assert answer.usage is not None
        seen[rid] = answer.usage.prompt_tokens, answer.usage.completion_tokens
    except openai.NotFoundError:
        seen[rid] = None
    except openai.APIError:
        pass  # cut by the kill: recorded once, or not at all


async def _traffic(fleet: Fleet, region: str, prefix: str, count: int, seen: Seen) -> None:
    client, room = fleet.client(region), asyncio.Semaphore(16)

    async def one(n: int) -> None:
        async with room:
            await _ask(client, f"{prefix}-{n}", n, seen)

    await asyncio.gather(*(one(n) for n in range(count)))
    await client.close()


async def _long(client: openai.AsyncOpenAI, rid: str, seen: Seen, began: set[str]) -> None:
    """A long stream, told its usage at its end; `began` once its client has text."""
    try:
        stream = await client.chat.completions.create(
            model=LLAMA, messages=[{"role": "user", "content": f"tell story {rid}"}],
            max_tokens=LONG, stream=True, stream_options={"include_usage": True},
            extra_headers={"X-Request-ID": rid}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                began.add(rid)
            if chunk.usage is not None:
                seen[rid] = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
    except openai.APIError:
        seen.pop(rid, None)


async def _records(url: str) -> list[dict[str, Any]]:
    names = ("request_id", "kind", "region", "came_from", "escalated_to", "api_key",
             "prompt_tokens", "completion_tokens", "outcome", "estimated", "cost_nanos",
             "calls", "model", "answered_model", "worker")  # fmt: skip
    rows = await sql(url, f"SELECT {', '.join(names)} FROM usage_records "  # noqa: S608
                          "WHERE kind <> 'meter'")  # fmt: skip
    return [dict(zip(names, row, strict=True)) for row in rows]


@pytest.mark.alone  # engines killed under traffic: timed waits beside other tests would stretch
async def test_each_request_is_charged_once_where_its_region_says(
    database_url: str, tmp_path: Path
) -> None:
    seen: Seen = {}
    started = int(time.time()) - 1
    async with fleet_of(database_url, tmp_path, REGIONS, change=_tiered) as fleet:
        prefix = fleet.keys["acme"].split(".", 1)[0]
        await asyncio.gather(*(_traffic(fleet, r, f"{r}-home", 500, seen) for r in REGIONS))
        # long streams in us-east, its engines slowed; killed -9 once every stream has text
        await fleet.speed_engines("us-east", 3.0)
        client, began = fleet.client("us-east"), set[str]()
        long = [f"long-{n}" for n in range(30)]
        streams = asyncio.gather(*(_long(client, rid, seen, began) for rid in long))
        async with asyncio.timeout(30):
            while len(began) < len(long):  # noqa: ASYNC110 (the streams' own tasks)
                await asyncio.sleep(0.05)
        await fleet.kill_engines("us-east")
        # at once, while us-east has no engine: tiered requests (7, 8, 9: one in three
        # cascaded), then the rest of the traffic
        tiered = [_ask(client, f"away-t{n}", 20 * n + 7 + n % 3, seen) for n in range(30)]
        await asyncio.gather(streams, *tiered, _traffic(fleet, "us-east", "away", 440, seen))
        await client.close()
        try:
            async with asyncio.timeout(60):
                while not set(seen) <= {r["request_id"] for r in await _records(database_url)}:  # noqa: ASYNC110 (other processes' rows)
                    await asyncio.sleep(0.5)
        except TimeoutError:
            have = {r["request_id"] for r in await _records(database_url)}
            missing = sorted(set(seen) - have)
            raise AssertionError(f"no record of {missing}: {[seen[m] for m in missing]}") from None
        await asyncio.sleep(1.0)  # anything recorded twice would be stored by now
        records = await _records(database_url)
        async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN, timeout=30) as http:
            answer = await http.get("/v1/usage", params={
                "start_time": started, "end_time": int(time.time()) + 1, "group_by": "region",
                "tenants": "acme"})  # fmt: skip
            assert answer.status_code == 200, answer.text
            report = answer.json()
    assert len(seen) >= 1_900, len(seen)
    by_request: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_request.setdefault(record["request_id"], []).append(record)
    count = {"escalated": 0, "carried": 0, "tiered": 0, "cascaded": 0, "left": 0, "refused": 0}
    for rid, outcome in seen.items():
        mine = by_request[rid]
        charged = [r for r in mine if r["kind"] in ("served", "refused")]
        assert len(charged) == 1, (rid, mine)  # charged once
        (record,) = charged
        assert record["api_key"] == prefix, record  # the client's key, wherever it ran
        home = "us-east" if rid.startswith(("long", "away")) else rid.split("-home")[0]
        others = [(r["kind"], r["region"]) for r in mine if r is not record]
        if record["region"] != home:  # escalated: its region recorded only the hop
            count["escalated"] += 1
            assert record["came_from"] == home, record
            assert others == [("hop", home)], mine
        elif others:  # parts a peer made: a stream carried on there, or a tier's answer
            count["carried" if rid.startswith("long") else "tiered"] += 1
            assert rid.startswith("long") or record["model"] == ROUTE, record
            assert {kind for kind, _ in others} == {"carried"}, mine
            for part in (r for r in mine if r["kind"] == "carried"):
                assert (part["cost_nanos"], part["came_from"]) == (0, home), part
        if outcome is None:
            count["refused"] += 1
            assert (record["kind"], record["completion_tokens"]) == ("refused", 0)
            assert record["cost_nanos"] == 0
            continue
        assert record["kind"] == "served", record
        assert record["cost_nanos"] > 0, record
        if outcome == "left":  # charged for what was made: told by its engine, or estimated
            count["left"] += 1  # from what its client got
            assert 1 <= record["completion_tokens"] <= 40, record
            continue
        assert isinstance(outcome, tuple)
        if record["calls"]:  # a cascade: both answers, each priced at its model
            count["cascaded"] += 1
            assert {c["model"] for c in record["calls"]} == {LLAMA, QWEN}, record
            assert (record["model"], record["answered_model"]) == (ROUTE, QWEN)
            summed = (sum(c["prompt_tokens"] for c in record["calls"]),
                      sum(c["completion_tokens"] for c in record["calls"]))  # fmt: skip
            assert (record["prompt_tokens"], record["completion_tokens"]) == summed
            assert outcome[1] < summed[1]  # its client was told of the answer it got
        else:
            assert (record["prompt_tokens"], record["completion_tokens"]) == outcome, rid
        if rid.startswith("long"):
            assert outcome[1] == LONG, (rid, outcome)  # whole, through the kill
    assert count["escalated"] >= 5, count  # after the kill, until its engines were back
    assert count["carried"] >= 10, count  # cut mid-answer, and no engine left in us-east
    assert count["cascaded"] >= 50, count
    # (a tiered request whose region has no engine for any tier goes to a peer whole, which
    # tiers it itself and records it: "tiered" counts only the ones a peer answered a tier of)
    assert count["left"] >= 50, count
    assert count["refused"] >= 50, count
    served = [r for r in records if r["kind"] == "served"]
    results = [res for bucket in report["data"] for res in bucket["results"]]
    assert sum(res["num_model_requests"] for res in results) == len(served)
    refused = [r for r in records if r["kind"] == "refused"]  # shed for load, too
    assert sum(res["num_refused_requests"] for res in results) == len(refused) >= count["refused"]
    assert sum(res["cost"]["nanos"] for res in results) == sum(r["cost_nanos"] for r in served)
