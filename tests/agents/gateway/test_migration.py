"""An answer that has started is finished: streams whose engine is killed with kill -9 go on on
another worker of the region, or, when the region has none left, in the peer its fallback rule
names. The client sees one stream: the same tokens an uninterrupted run gives, no repeat, no
gap, one [DONE], and usage that counts the whole answer. Its usage record is one too: a
stream carried on in the peer is recorded whole by the region its client came to, as an
uninterrupted one is, and the peer records its part as `carried`, at no cost.

The engines are real simulators, whose output is a function of the context (the prompt and
the answer so far), as a model's greedy decoding is; the gateways run in the test's process.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents.ledger.journal import Journal
from agents.ledger.record import Ledger
from tests.kits.inproc import KEY, MODEL, Local, escalating_pair
from tests.kits.sim import Sim, running_sim

AUTH = {"Authorization": f"Bearer {KEY}"}
TOKENS = 48
SLOW = ("--slow-factor", "6")  # about 60 ms a token: a stream lasts seconds


def _chat(n: int, path: str) -> dict[str, Any]:
    if path == "/v1/completions":
        return {"model": MODEL, "prompt": f"story number {n} begins", "max_tokens": TOKENS,
                "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    return {"model": MODEL, "messages": [{"role": "user", "content": f"tell story {n}"}],
            "max_tokens": TOKENS, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip


def _text(events: list[Any]) -> str:
    parts = []
    for event in events:
        if isinstance(event, dict) and event.get("choices"):
            choice = event["choices"][0]
            parts.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


class Streams:
    """Concurrent streams through one gateway, read as they come."""

    def __init__(self, region: Local, path: str) -> None:
        self.region, self.path = region, path
        self.events: dict[int, list[Any]] = {}
        self.started: set[int] = set()  # streams the client has seen text of
        self.all_started = asyncio.Event()
        self.count = 0

    async def one(self, client: httpx.AsyncClient, n: int) -> None:
        events = self.events.setdefault(n, [])
        async with client.stream("POST", self.path, json=_chat(n, self.path)) as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    payload = line[len("data: ") :]
                    events.append(payload if payload == "[DONE]" else json.loads(payload))
                    if _text(events):
                        self.started.add(n)
                        if len(self.started) == self.count:
                            self.all_started.set()

    async def run(self, numbers: range) -> list[BaseException | None]:
        self.count = len(numbers)
        async with httpx.AsyncClient(base_url=self.region.url, headers=AUTH, timeout=60) as c:
            calls = (self.one(c, n) for n in numbers)
            return await asyncio.gather(*calls, return_exceptions=True)


async def _uninterrupted(region: Local, path: str, numbers: range) -> dict[int, str]:
    streams = Streams(region, path)
    assert not any(await streams.run(numbers))
    return {n: _text(e) for n, e in streams.events.items()}


async def _all_started(streams: Streams) -> None:
    async with asyncio.timeout(20):
        await streams.all_started.wait()


def _busiest(region: Local, sims: dict[str, Sim]) -> Sim:
    inflight = region.inflight()
    return sims[max((w for w in inflight if w in sims), key=lambda w: inflight[w])]


async def _check(streams: Streams, expected: dict[int, str], region: Local) -> None:
    for n, events in streams.events.items():
        assert events[-1] == "[DONE]", (n, events[-3:])
        assert events.count("[DONE]") == 1
        assert not any(isinstance(e, dict) and "error" in e for e in events), n
        assert _text(events) == expected[n], n  # token for token, no repeat, no gap
        usage = events[-2]["usage"]
        assert usage["completion_tokens"] == TOKENS, (n, usage)
        roles = [e for e in events if isinstance(e, dict) and e.get("choices")
                 and "role" in (e["choices"][0].get("delta") or {})]  # fmt: skip
        assert len(roles) <= 1  # one stream: one role chunk at most
    ids = {e["id"] for events in streams.events.values() for e in events if isinstance(e, dict)}
    assert len(ids) == len(streams.events)  # each stream keeps its one id


def _records(journal: Journal) -> list[pb.UsageRecord]:
    journal.flush()
    records: list[pb.UsageRecord] = journal.records_after(0, 10_000)
    return records


def _tokens(records: list[pb.UsageRecord]) -> list[tuple[int, int]]:
    return sorted((r.prompt_tokens, r.completion_tokens) for r in records)


async def test_streams_cut_by_a_killed_engine_finish_elsewhere_token_for_token(
    tmp_path: Path,
) -> None:
    async with (
        running_sim(*SLOW, model=MODEL) as s0, running_sim(*SLOW, model=MODEL) as s1,
        running_sim(*SLOW, model=MODEL) as s2, running_sim(*SLOW, model=MODEL) as peer,
    ):  # fmt: skip
        sims = {"a-w0": s0, "a-w1": s1, "a-w2": s2}
        async with escalating_pair([s.url for s in sims.values()], [peer.url]) as (a, b):
            journals = {"a": Journal(tmp_path / "a"), "b": Journal(tmp_path / "b")}
            a.gateway.accounts.ledger = Ledger(journals["a"], lambda: "a-1")
            b.gateway.accounts.ledger = Ledger(journals["b"], lambda: "b-1")
            for path, first in (("/v1/chat/completions", 0), ("/v1/completions", 100)):
                numbers = range(first, first + 20)
                expected = await _uninterrupted(a, path, numbers)
                streams = Streams(a, path)
                run = asyncio.ensure_future(streams.run(numbers))
                await _all_started(streams)
                victim = _busiest(a, sims)
                victim.process.kill()  # kill -9, mid-answer
                assert not any(await run)
                await _check(streams, expected, a)
                assert a.gateway.books.migrations, "nothing migrated"
                sims = {w: s for w, s in sims.items() if s is not victim}
            # every engine of the region killed: the streams go on in the peer region
            numbers = range(200, 220)
            expected = await _uninterrupted(a, "/v1/chat/completions", numbers)
            whole = _records(journals["a"])[-len(numbers) :]
            assert {r.kind for r in whole} == {"served"}
            known = len(_records(journals["a"]))
            streams = Streams(a, "/v1/chat/completions")
            run = asyncio.ensure_future(streams.run(numbers))
            await _all_started(streams)
            for sim in sims.values():
                sim.process.kill()
            assert not any(await run)
            await _check(streams, expected, a)
            peered = {k: n for k, n in a.gateway.books.migrations.items() if k[1] == "peer"}
            assert peered, a.gateway.books.migrations
            assert a.idle()
            assert b.idle()
            # one record each, in the region the client came to, as if nothing had broken
            mine = _records(journals["a"])[known:]
            assert {r.kind for r in mine} == {"served"}, [r.kind for r in mine]
            assert _tokens(mine) == _tokens(whole)
            carried = [r for r in mine if r.escalated_to == "b"]
            assert carried
            assert all(r.worker.startswith("a-w") for r in carried)
            theirs = [r for r in _records(journals["b"]) if r.kind == "carried"]
            assert sorted(r.request_id for r in theirs) == sorted(r.request_id for r in carried)
            assert all(r.came_from == "a" and r.cost_nanos == 0 for r in theirs)
            assert not [r for r in _records(journals["b"]) if r.kind == "served"]
            for journal in journals.values():
                journal.close()
