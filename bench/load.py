"""Workloads and the client that plays them: OpenAI chat requests, streamed, each on a fresh
connection (sglang-router 0.3.2 delays streamed first bytes on reused connections; nobody
should win on that), arriving as a Poisson process or as multi-turn conversations.

A request's time to first token is from sending to the first content byte; its inter-token
gap is the mean over its answer, (last chunk - first chunk) / (completion tokens - 1), so the
stream interval, which batches tokens into chunks, does not change it.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from bench.harness import MODEL


@dataclass
class Req:
    messages: list[dict[str, str]]
    max_tokens: int
    group: int = 0
    model: str | None = None  # the client's model when None


@dataclass
class Result:
    status: int
    ttft_s: float = 0.0
    itl_s: float = 0.0
    completion: int = 0
    error: str = ""
    answer: str = ""
    region: str = ""  # the region that served it (x-meridian-region), when a gateway did
    sent_at: float = 0.0  # the event loop's time when it was sent
    done: float = 0.0  # and when it ended
    service_class: str = ""  # the class that served it (x-meridian-class), when a gateway did

    def meets(self, ttft_s: float, itl_s: float) -> bool:
        return self.status == 200 and self.ttft_s <= ttft_s and self.itl_s <= itl_s


def _words(prefix: str, count: int, rng: random.Random) -> str:
    return " ".join(f"{prefix}{rng.randrange(1_000_000)}" for _ in range(count))


def shared_prefix(
    groups: int, per_group: int, system_tokens: int, question_tokens: int, output: int, seed: int
) -> list[Req]:
    """SGLang bench_serving's generated-shared-prefix: groups of prompts sharing a long system
    prompt, each with its own question, shuffled. The simulator counts a word a token."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        system = _words(f"g{g}s", system_tokens, rng)
        for _ in range(per_group):
            messages = [{"role": "system", "content": system},
                        {"role": "user", "content": _words("q", question_tokens, rng)}]  # fmt: skip
            out.append(Req(messages, output, g))
    rng.shuffle(out)
    return out


@dataclass
class Conversation:
    """A multi-turn chat: each turn sends the whole history and the next question."""

    system: str
    questions: list[str]
    output: int
    history: list[dict[str, str]] = field(default_factory=list)


def conversations(
    count: int, turns: int, system_tokens: int, question_tokens: int, output: int, seed: int
) -> list[Conversation]:
    rng = random.Random(seed)
    shared = _words("sys", system_tokens, rng)  # one assistant, many users
    return [
        Conversation(shared, [_words(f"c{c}t", question_tokens, rng) for _ in range(turns)], output)
        for c in range(count)
    ]


class Client:
    def __init__(
        self, headers: dict[str, str] | None = None, model: str = MODEL, stream: bool = True
    ) -> None:
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.model = model
        self.stream = stream  # False: whole answers (ttft_s is then the whole latency)
        self.tiers: Counter[str] = Counter()  # the tier (x-meridian-tier's model) of each answer
        connector = aiohttp.TCPConnector(limit=0, force_close=True)  # a fresh connection each
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=600)
        )

    async def close(self) -> None:
        await self.session.close()

    async def chat(self, url: str, req: Req) -> Result:
        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        result = await self._chat(url, req)
        result.sent_at, result.done = sent_at, loop.time()
        return result

    async def _chat(self, url: str, req: Req) -> Result:
        if not self.stream:
            return await self._whole(url, req)
        body = orjson.dumps({
            "model": req.model or self.model, "messages": req.messages,
            "max_tokens": req.max_tokens,
            "stream": True, "stream_options": {"include_usage": True},
        })  # fmt: skip
        sent = time.perf_counter()
        first = last = 0.0
        completion, pieces = 0, []
        try:
            async with self.session.post(
                f"{url}/v1/chat/completions", data=body, headers=self.headers
            ) as response:
                region = response.headers.get("x-meridian-region", "")
                served_as = response.headers.get("x-meridian-class", "")
                tier = response.headers.get("x-meridian-tier")
                if tier is not None:
                    self.tiers[tier.split(";", 1)[0]] += 1
                if response.status != 200:
                    return Result(response.status, error=(await response.text())[:200])
                buffer = b""
                async for chunk in response.content.iter_any():
                    buffer += chunk
                    while b"\n\n" in buffer:
                        event, buffer = buffer.split(b"\n\n", 1)
                        if not event.startswith(b"data: ") or event == b"data: [DONE]":
                            continue
                        data = orjson.loads(event[6:])
                        if "error" in data:
                            return Result(502, error=str(data["error"])[:200])
                        choices = data.get("choices") or []
                        if choices and choices[0].get("delta", {}).get("content"):
                            last = time.perf_counter()
                            first = first or last
                            pieces.append(choices[0]["delta"]["content"])
                        if data.get("usage"):
                            completion = int(data["usage"].get("completion_tokens") or 0)
        except (aiohttp.ClientError, TimeoutError) as error:
            return Result(0, error=f"{type(error).__name__}: {error}")
        if not first:
            return Result(502, error="no content")
        itl = (last - first) / (completion - 1) if completion > 1 else 0.0
        return Result(200, first - sent, itl, completion, answer="".join(pieces), region=region,
                      service_class=served_as)  # fmt: skip

    async def _whole(self, url: str, req: Req) -> Result:
        body = orjson.dumps(
            {"model": req.model or self.model, "messages": req.messages,
             "max_tokens": req.max_tokens}
        )  # fmt: skip
        sent = time.perf_counter()
        try:
            async with self.session.post(
                f"{url}/v1/chat/completions", data=body, headers=self.headers
            ) as response:
                data = await response.read()
                if response.status != 200:
                    return Result(response.status, error=data[:200].decode(errors="replace"))
                answer = orjson.loads(data)
                served_as = response.headers.get("x-meridian-class", "")
                region = response.headers.get("x-meridian-region", "")
        except (aiohttp.ClientError, TimeoutError) as error:
            return Result(0, error=f"{type(error).__name__}: {error}")
        completion = int((answer.get("usage") or {}).get("completion_tokens") or 0)
        text = answer["choices"][0]["message"].get("content") or ""
        return Result(200, time.perf_counter() - sent, 0.0, completion, answer=text,
                      region=region, service_class=served_as)  # fmt: skip


async def poisson(
    client: Client,
    pick: Callable[[int], str],
    reqs: list[Req],
    rate: float,
    seed: int,
    until: asyncio.Future[Any] | None = None,
) -> tuple[list[Result], float]:
    """Send `reqs` at Poisson arrivals of `rate` a second (or until `until` is done, if it is
    first); the results and the span in s."""
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    start = loop.time()
    at = 0.0
    tasks = []
    for i, req in enumerate(reqs):
        at += rng.expovariate(rate)
        delay = start + at - loop.time()
        if delay > 0:
            if until is None:
                await asyncio.sleep(delay)
            else:
                await asyncio.wait({until}, timeout=delay)
        if until is not None and until.done():
            break
        tasks.append(asyncio.create_task(client.chat(pick(i), req)))
    results = await asyncio.gather(*tasks)
    return list(results), loop.time() - start


async def play_conversations(
    client: Client, pick: Callable[[int], str], chats: list[Conversation], rate: float, seed: int
) -> tuple[list[Result], float]:
    """Conversations start at Poisson arrivals; each sends its turns one after the other."""
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def talk(i: int, chat: Conversation) -> list[Result]:
        results = []
        history: list[dict[str, str]] = [{"role": "system", "content": chat.system}]
        for question in chat.questions:
            history.append({"role": "user", "content": question})
            result = await client.chat(pick(i), Req(list(history), chat.output))
            results.append(result)
            if result.status != 200:
                break
            history.append({"role": "assistant", "content": result.answer})
        return results

    tasks, at = [], 0.0
    for i, chat in enumerate(chats):
        at += rng.expovariate(rate)
        delay = start + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(talk(i, chat)))
    done = await asyncio.gather(*tasks)
    return [r for results in done for r in results], loop.time() - start


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=1000, method="inclusive")[min(998, int(q * 1000) - 1)]


def warm_ttft_p99(reqs: list[Req], results: list[Result]) -> float:
    """The TTFT p99 of the requests that are not the first of their prefix group sent: the
    first finds no cache anywhere (a miss no router can avoid), so from cold caches, with
    more than 1% of requests the first of their group, the plain p99 is that miss's
    prefill whatever the routing."""
    seen: set[int] = set()
    warm = []
    for req, result in zip(reqs, results, strict=True):
        if req.group in seen and result.status == 200:
            warm.append(result.ttft_s)
        seen.add(req.group)
    return round(quantile(warm, 0.99), 4)


def summarize(
    results: list[Result], span_s: float, ttft_slo: float, itl_slo: float
) -> dict[str, Any]:
    ok = [r for r in results if r.status == 200]
    good = [r for r in ok if r.meets(ttft_slo, itl_slo)]
    return {
        "requests": len(results),
        "failed": len(results) - len(ok),
        "rejected": sum(r.status in (429, 503) for r in results),
        "slo_met": round(len(good) / max(1, len(results)), 4),
        "ttft_p50_s": round(quantile([r.ttft_s for r in ok], 0.50), 4),
        "ttft_p99_s": round(quantile([r.ttft_s for r in ok], 0.99), 4),
        "itl_p50_s": round(quantile([r.itl_s for r in ok], 0.50), 5),
        "itl_p99_s": round(quantile([r.itl_s for r in ok], 0.99), 5),
        "output_tok_per_s": round(sum(r.completion for r in ok) / max(span_s, 1e-9), 1),
        "goodput_rps": round(len(good) / max(span_s, 1e-9), 3),
        "statuses": dict(Counter(r.status for r in results if r.status != 200)),
    }


async def sweep(
    start: float, growth: float, max_phases: int, passes: Callable[[float, int], Awaitable[bool]]
) -> float:
    """The highest rate that `passes` (a phase at that rate, with a seed): up by `growth` from
    `start` until a phase fails (down from a start past capacity), then two steps of
    bisection between the last pass and the first fail; 0 when none passed."""
    rate, capacity = start, 0.0
    failed_at: float | None = None
    for i in range(max_phases):
        if await passes(rate, i):
            capacity, rate = rate, rate * growth
            if failed_at is not None:  # came down from a start past capacity
                break
            continue
        failed_at = rate
        if capacity:
            break
        rate /= growth  # the start rate was past capacity: come down
    for step in range(2):
        if failed_at is None or not capacity:
            break
        mid = math.sqrt(capacity * failed_at)
        if await passes(mid, 100 + step):
            capacity = mid
        else:
            failed_at = mid
    return capacity
