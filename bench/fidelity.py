"""`meridian bench fidelity`: the simulator measured against the real SGLang.

The same workload goes to two simulated engines and then to two real SGLang engines (the
version Meridian supports, on this machine's CPU, serving the tiny model Meridian makes),
each pair behind the same router (one Meridian region, the cost policy): shared-prefix chat
(groups of prompts sharing a long system prompt, each with its own question), answers of
mixed lengths, at rising concurrency (closed loops of 1, 4, 16 clients). Side by side, for
each level: TTFT and inter-token latency (p50, p90), the prefix hit rate (the engines' own
`cached_tokens` over prompt tokens), and queueing (the engines' running and waiting requests,
polled from `/v1/loads` every 100 ms).

Both KV pools are the same size (65,536 tokens), so that they fill alike, and both count
tokens with the tiny model's tokenizer (the simulator started with `--model-path` at it), so
that a prompt is as many tokens on either. Timing cannot agree:
the simulator is calibrated to SGLang serving Llama-3.1-8B on an H100, the real engine here
is a CPU serving a two-layer model. Hit rates and queueing should; the report says where they
do not, and by how much.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
from rich.console import Console
from rich.table import Table

from agents.engines import sglang_env, tiny_model
from agents.engines.backends import SglangBackend
from agents.engines.base import EngineSpec
from bench.harness import MODEL, Sim, flush, start_region, start_sims
from bench.load import quantile
from bench.plots import write_json
from meridian.procs import free_port, stop_child, wait_ready

KV_TOKENS = 65_536
LEVELS = (1, 4, 16)


@dataclass(frozen=True)
class Options:
    root: Path
    requests: int  # per concurrency level
    out: Path | None
    seed: int = 7


@dataclass
class Answer:
    ttft_s: float
    itl_s: float
    prompt: int
    cached: int
    ok: bool


@dataclass
class Queue:
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)


def workload(count: int, seed: int) -> list[tuple[list[dict[str, str]], int]]:
    """Shared-prefix chat: groups of 8 questions behind one system prompt, answers of 16 to
    96 tokens, shuffled."""
    rng = random.Random(seed)
    words = tiny_model.WORDS
    out = []
    for group in range(max(1, count // 8)):
        system = " ".join(rng.choice(words) for _ in range(180)) + f" (group {group})"
        for _ in range(8):
            question = " ".join(rng.choice(words) for _ in range(16))
            messages = [{"role": "system", "content": system},
                        {"role": "user", "content": question}]  # fmt: skip
            out.append((messages, rng.choice((16, 32, 64, 96))))
    rng.shuffle(out)
    return out[:count]


async def _one(http: aiohttp.ClientSession, url: str, messages: Any, tokens: int) -> Answer:
    body = orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": tokens,
                         "temperature": 0, "ignore_eos": True, "stream": True,
                         "stream_options": {"include_usage": True}})  # fmt: skip
    sent = time.perf_counter()
    first = last = 0.0
    usage: dict[str, Any] = {}
    async with http.post(f"{url}/v1/chat/completions", data=body) as response:
        if response.status != 200:
            return Answer(0, 0, 0, 0, False)
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            doc = orjson.loads(line[6:])
            choices = doc.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                last = time.perf_counter()
                first = first or last
            usage = doc.get("usage") or usage
    done = int(usage.get("completion_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    itl = (last - first) / (done - 1) if done > 1 else 0.0
    return Answer(first - sent, itl, int(usage.get("prompt_tokens") or 0), cached, first > 0)


async def _poll(engines: list[str], queue: Queue, stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=5) as http:
        while not stop.is_set():
            running = waiting = 0
            for url in engines:
                loads = (await http.get(f"{url}/v1/loads")).json()["loads"]
                running += sum(int(r["num_running_reqs"]) for r in loads)
                waiting += sum(int(r["num_waiting_reqs"]) for r in loads)
            queue.running.append(running)
            queue.waiting.append(waiting)
            await asyncio.sleep(0.1)


async def _level(
    gateway: str, key: str, engines: list[str], work: list[Any], clients: int
) -> dict[str, Any]:
    pending = list(work)
    answers: list[Answer] = []
    queue, stop = Queue(), asyncio.Event()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(headers=headers) as http:

        async def loop() -> None:
            while pending:
                messages, tokens = pending.pop()
                answers.append(await _one(http, gateway, messages, tokens))

        poller = asyncio.create_task(_poll(engines, queue, stop))
        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(clients)))
        span = time.perf_counter() - started
        stop.set()
        await poller
    good = [a for a in answers if a.ok]
    ms = [a.ttft_s * 1000 for a in good]
    itl = [a.itl_s * 1000 for a in good if a.itl_s > 0]
    prompt = sum(a.prompt for a in good)
    return {
        "clients": clients, "answered": len(good), "failed": len(answers) - len(good),
        "ttft_ms_p50": round(quantile(ms, 0.5), 1), "ttft_ms_p90": round(quantile(ms, 0.9), 1),
        "itl_ms_p50": round(quantile(itl, 0.5), 2), "itl_ms_p90": round(quantile(itl, 0.9), 2),
        "hit_rate": round(sum(a.cached for a in good) / prompt, 3) if prompt else 0.0,
        "requests_per_s": round(len(good) / span, 2),
        "running_mean": round(statistics.fmean(queue.running or [0]), 2),
        "waiting_mean": round(statistics.fmean(queue.waiting or [0]), 2),
        "waiting_max": max(queue.waiting or [0]),
    }  # fmt: skip


async def _start_real(stack: AsyncExitStack, root: Path, count: int) -> list[Sim]:
    python = sglang_env.python_of(sglang_env.env_dir())
    model = tiny_model.write(root.parent / "tiny-model")
    backend = SglangBackend(str(python), cpu=True)
    engines = []
    for i in range(count):
        port = free_port()
        spec = EngineSpec(
            id=f"real-{i}", deployment="real", model=MODEL, backend="sglang", role="unified",
            url=f"http://127.0.0.1:{port}", port=port, model_source=str(model),
            context_length=4096, engine_args=(("max-total-tokens", KV_TOKENS),),
        )  # fmt: skip
        launch = await asyncio.to_thread(backend.launch, spec)
        log = (root / f"real-{i}.log").open("wb")
        process = await asyncio.create_subprocess_exec(
            *launch.argv, env={**os.environ, **launch.env}, stdout=log, stderr=log
        )
        stack.push_async_callback(stop_child, process, 30)
        engines.append(Sim(process, spec.url, 1.0))
    for engine in engines:
        await wait_ready(engine.url, engine.process, 600, path="/ready", what="an SGLang engine")
    return engines


async def _measure(console: Console, name: str, options: Options) -> list[dict[str, Any]]:
    root = options.root / name
    root.mkdir(parents=True, exist_ok=True)
    async with AsyncExitStack() as stack:
        with console.status(f"starting two {name} engines and a region"):
            if name == "sim":  # counting tokens with the tiny model's tokenizer, as SGLang
                model = tiny_model.write(options.root / "tiny-model")
                engines = await start_sims(stack, 2, max_total_tokens=KV_TOKENS,
                                           stream_interval=1, log_dir=root,
                                           extra=("--model-path", str(model)))  # fmt: skip
            else:
                engines = await _start_real(stack, root, 2)
            region = await start_region(stack, root, engines)
            await region.route("cost", {})
            key = await region.tenant_key("bench", requests_per_minute=10**7,
                                          tokens_per_minute=10**10)  # fmt: skip
        rows = []
        for clients in LEVELS:
            await flush(engines)
            work = workload(options.requests, options.seed)
            with console.status(f"{name}: {clients} client(s), {len(work)} requests"):
                urls = [e.url for e in engines]
                rows.append(await _level(region.gateway_urls[0], key, urls, work, clients))
        return rows


def _table(console: Console, results: dict[str, list[dict[str, Any]]]) -> None:
    table = Table(title="the simulator beside the real SGLang (two engines each, one router)")
    for column in ("engines", "clients", "TTFT p50/p90 ms", "ITL p50/p90 ms", "hit rate",
                   "req/s", "running", "waiting mean/max", "failed"):  # fmt: skip
        table.add_column(column, justify="right")
    for name, rows in results.items():
        for r in rows:
            table.add_row(
                name, str(r["clients"]), f"{r['ttft_ms_p50']} / {r['ttft_ms_p90']}",
                f"{r['itl_ms_p50']} / {r['itl_ms_p90']}", f"{r['hit_rate']:.1%}",
                str(r["requests_per_s"]), str(r["running_mean"]),
                f"{r['waiting_mean']} / {r['waiting_max']}", str(r["failed"]),
            )  # fmt: skip
    console.print(table)


def verdict(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Where the two agree and where they do not, level by level, in words."""
    out = []
    for sim, real in zip(results.get("sim", []), results.get("real", []), strict=False):
        level = f"{sim['clients']} client(s)"
        gap = abs(sim["hit_rate"] - real["hit_rate"])
        out.append(f"{level}: hit rate {sim['hit_rate']:.1%} simulated, {real['hit_rate']:.1%} "
                   f"real ({'agree' if gap <= 0.05 else 'DIFFER'}, {gap:.1%} apart)")  # fmt: skip
        if real["ttft_ms_p50"] and sim["ttft_ms_p50"]:
            ratio = real["ttft_ms_p50"] / sim["ttft_ms_p50"]
            out.append(
                f"{level}: TTFT p50 {ratio:.1f}x the simulator's (CPU and tiny model "
                "against an H100's calibration: timing is not expected to agree)"
            )
        out.append(f"{level}: waiting mean {sim['waiting_mean']} simulated, "
                   f"{real['waiting_mean']} real; running mean {sim['running_mean']} "
                   f"simulated, {real['running_mean']} real")  # fmt: skip
    return out


async def run(options: Options) -> dict[str, Any]:
    console = Console()
    results: dict[str, list[dict[str, Any]]] = {}
    document: dict[str, Any] = {
        "sglang": sglang_env.SGLANG_VERSION,
        "levels": list(LEVELS),
        "requests_per_level": options.requests,
        "results": results,
    }
    for name in ("sim", "real"):
        results[name] = await _measure(console, name, options)
        write_json(console, document, options.out)  # each part kept as it is done
    _table(console, results)
    document["verdict"] = verdict(results)
    for line in document["verdict"]:
        console.print(line)
    write_json(console, document, options.out)
    return document
