"""`meridian bench overhead`: what a router adds over a null engine that answers at once.

Three targets on the same null engine (`bench/null_engine.py`): the engine itself,
Meridian's gateway (one agent, its default `cost` policy) and sglang-router 0.3.2 (its
default `cache_aware`). Meridian's gateway is measured with the operator's token
(`meridian`: no quota) and with a tenant's key (`meridian_tenant`: the key's lookup, the
quota's buckets and its lease, the demand tally, the usage record; a quota high enough never
to refuse), with a key of a tenant with a spend budget (`meridian_tenant_budget`: its
reservation at admission and its settlement, a budget too high to refuse), with a tenant's
key naming its LoRA adapter (`meridian_tenant_adapter`), with a key just rotated, its old
secret still taken (`meridian_tenant_rotated`), and with a tenant's key again on an agent that
keeps no usage ledger (`meridian_tenant_no_ledger`).
Latency: requests one at a time, the targets interleaved, each request on a fresh connection
(as the routing benchmark; sglang-router delays streamed bytes on reused connections); the
added latency is a target's percentile less the engine's own. Throughput: a closed loop of
concurrent clients for a while, and the router's own CPU seconds, read from /proc: requests
served per CPU second of the router process. The quality guard's detectors run in every
`meridian` row; their own cost an answer and a chunk is timed apart
(bench/detector_cost.py), as is a tiered route's choice a request (bench/tier_cost.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from rich.console import Console
from rich.table import Table

from agents.gateway.relay import upstream_headers
from agents.gateway.upstream import Upstream
from bench import plots
from bench.detector_cost import detector_cost
from bench.harness import (
    MODEL,
    start_null_engine,
    start_region,
    start_sglang_router,
)
from bench.load import quantile
from bench.procfs import cpu_seconds, machine_busy
from bench.tier_cost import classifier_cost
from bench.tiers import Options as TierOptions
from bench.tiers import workload
from meridian.procs import free_port

# the same gateway with tracing on, every span exported (OTLP/HTTP) at these shares
TRACED = {"meridian_traced_1pct": 0.01, "meridian_traced_100pct": 1.0}
# the untraced gateway again, called with a tenant's key: its key, its quota's buckets and
# lease, its demand tally (the operator's requests are counted against no quota)
TENANT = "meridian_tenant"
# a tenant's key again, on an agent that keeps no usage ledger: `meridian_tenant` less this is
# what a usage record costs a request (its making, and its copy into the journal)
UNLEDGERED = "meridian_tenant_no_ledger"
# a tenant's key again, of a tenant with a spend budget: `meridian_tenant` less this is what
# a request's reservation and its settlement cost (agents/gateway/budgets.py)
BUDGETED = "meridian_tenant_budget"
# a tenant's key again, its requests naming its LoRA adapter (`model`): `meridian_tenant` less
# this is what finding the adapter and setting `lora_path` cost (agents/adapter_config.py)
ADAPTED = "meridian_tenant_adapter"
ADAPTER = "bench-adapter"
# a tenant's key again, just rotated, its old secret still taken: `meridian_tenant` less this
# is what a rotation's overlap costs the key check (both secrets in the snapshot)
ROTATED = "meridian_tenant_rotated"
QUOTA = {"requests_per_minute": 10_000_000, "tokens_per_minute": 1_000_000_000}
BUDGET = {"name": "monthly", "period": "month", "limit": 1_000_000_000}
ROUTERS = ("meridian", TENANT, ROTATED, ADAPTED, BUDGETED, UNLEDGERED, *TRACED,
           "sglang_router")  # fmt: skip
MODELS = {ADAPTED: ADAPTER}  # a row's `model`, where it is not the model's


@dataclass
class Options:
    requests: int = 1000  # latency samples per target and mode
    concurrency: int = 32
    seconds: float = 10.0
    out: Path | None = None
    plot: Path | None = None
    root: Path = Path(".")


def _body(stream: bool, model: str = MODEL) -> bytes:
    return orjson.dumps({
        "model": model, "max_tokens": 1, "stream": stream,
        "messages": [{"role": "user", "content": "Say one word."}],
    })  # fmt: skip


async def _once(session: aiohttp.ClientSession, url: str, body: bytes, headers: Any) -> float:
    started = time.perf_counter()
    async with session.post(f"{url}/v1/chat/completions", data=body, headers=headers) as answer:
        await answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{url}: {answer.status}")
    return time.perf_counter() - started


async def _latency(
    targets: dict[str, str],
    headers: dict[str, dict[str, str]],
    options: Options,
    console: Console,
) -> dict[str, dict[str, list[float]]]:
    samples: dict[str, dict[str, list[float]]] = {n: {"plain": [], "stream": []} for n in targets}
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        for mode in ("plain", "stream"):
            bodies = {n: _body(mode == "stream", MODELS.get(n, MODEL)) for n in targets}
            for name, url in targets.items():  # warm up
                for _ in range(50):
                    await _once(session, url, bodies[name], headers[name])
            with console.status(f"latency, {mode}: {options.requests} requests a target"):
                for _ in range(options.requests):
                    for name, url in targets.items():
                        took = await _once(session, url, bodies[name], headers[name])
                        samples[name][mode].append(took)
    return samples


async def _throughput(
    url: str, pid: int | None, headers: dict[str, str], options: Options, model: str = MODEL
) -> dict[str, float]:
    body = _body(False, model)
    done = 0
    stop = False

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done
        while not stop:
            await _once(session, url, body, headers)
            done += 1

    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(100):
            await _once(session, url, body, headers)
        cpu = cpu_seconds(pid) if pid else 0.0
        machine = machine_busy()
        started = time.perf_counter()
        tasks = [asyncio.create_task(worker(session)) for _ in range(options.concurrency)]
        await asyncio.sleep(options.seconds)
        stop = True
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - started
        used = (cpu_seconds(pid) - cpu) if pid else 0.0
        busy, total = machine_busy()
    return {
        "rps": round(done / elapsed, 1),
        "cpu_cores": round(used / elapsed, 3),
        "rps_per_core": round(done / used, 1) if used else 0.0,
        "machine_busy": round((busy - machine[0]) / max(1, total - machine[1]), 3),
    }


async def _clients(url: str, requests: int = 4000, concurrency: int = 8) -> dict[str, float]:
    """The gateway's client to the engines against aiohttp's, pooled and tuned as the gateway
    had it: CPU microseconds of this process a request, the same closed loop on the engine."""
    body, headers = _body(False), upstream_headers("bench")
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
    )  # fmt: skip
    upstream = Upstream()

    async def by_aiohttp() -> None:
        head = {"Content-Type": "application/json", "X-Request-ID": "bench"}
        async with session.post(f"{url}/v1/chat/completions", data=body, headers=head) as r:
            await r.read()

    async def by_upstream() -> None:
        answer = await upstream.post(url, "/v1/chat/completions", body, headers)
        await answer.read()
        answer.release()

    out: dict[str, float] = {}
    try:
        for name, call in (("aiohttp_us", by_aiohttp), ("upstream_us", by_upstream)) * 2:

            async def loop(call: Any = call) -> None:
                for _ in range(requests // concurrency):
                    await call()

            await loop()
            started = time.process_time()
            await asyncio.gather(*(loop() for _ in range(concurrency)))
            used = (time.process_time() - started) / (requests // concurrency * concurrency)
            out[name] = min(out.get(name, 1e9), round(used * 1e6, 1))  # the better of two
    finally:
        await session.close()
        await upstream.close()
    return out


async def run(options: Options) -> dict[str, Any]:
    console = Console(width=150)
    async with AsyncExitStack() as stack:
        null = await start_null_engine(stack, options.root)
        engine, url, sims = null.process, null.url, [null]
        sink = await _trace_sink(stack)
        traced: list[dict[str, str]] = [
            {},
            *(
                {"MERIDIAN_AGENT_TRACE_ENDPOINT": sink, "MERIDIAN_AGENT_TRACE_SAMPLE": str(share)}
                for share in TRACED.values()
            ),
            {"MERIDIAN_AGENT_USAGE_LEDGER": "false"},
        ]
        with console.status("starting a region (PostgreSQL, control plane, agents)"):
            region = await start_region(
                stack, options.root, sims, gateways=len(traced), agent_env=traced
            )
            await region.route("cost", {})
        router = await start_sglang_router(stack, "cache_aware", sims, options.root)
        gateways = dict(zip(["meridian", *TRACED, UNLEDGERED], region.gateway_urls, strict=True))
        for same in (TENANT, BUDGETED, ADAPTED, ROTATED):
            gateways[same] = gateways["meridian"]
        targets = {"engine": url, **gateways, "sglang_router": router.url}
        pids = dict(zip(["meridian", *TRACED, UNLEDGERED], region.pids, strict=True))
        for same in (TENANT, BUDGETED, ADAPTED, ROTATED):
            pids[same] = pids["meridian"]
        pids["sglang_router"] = router.process.pid
        operator = {"Authorization": f"Bearer {region.operator}",
                    "Content-Type": "application/json"}  # fmt: skip
        headers = dict.fromkeys(targets, operator)
        key = await region.tenant_key("bench", **QUOTA)
        headers[TENANT] = headers[UNLEDGERED] = headers[ADAPTED] = {
            **operator, "Authorization": f"Bearer {key}"
        }  # fmt: skip
        await region.adapter(ADAPTER, "bench")
        key = await region.tenant_key("bench-budget", **QUOTA, budgets=[BUDGET])
        headers[BUDGETED] = {**operator, "Authorization": f"Bearer {key}"}
        key = await region.tenant_key("bench-rotated", rotated=True, **QUOTA)
        headers[ROTATED] = {**operator, "Authorization": f"Bearer {key}"}
        samples = await _latency(targets, headers, options, console)
        throughput: dict[str, dict[str, float]] = {}
        plots.write_json(console, _result(samples, throughput), options.out)  # each part kept
        with console.status("the gateway's client against aiohttp's, on the engine"):
            clients = await _clients(url)
        gateways_pids = sorted({pids[n] for n in gateways})
        for name in (*ROUTERS, "engine"):
            with console.status(f"throughput of {name}: {options.concurrency} clients"):
                pid = pids.get(name, engine.pid)
                # the other gateways are paused meanwhile: their polls would take CPU from it
                idle = [p for p in gateways_pids if p != pid]
                with _paused(idle):
                    model = MODELS.get(name, MODEL)
                    throughput[name] = await _throughput(
                        targets[name], pid, headers[name], options, model
                    )
                plots.write_json(console, _result(samples, throughput), options.out)
    result = _result(samples, throughput)
    result["clients"] = clients
    with console.status("the quality guard's detectors, an answer at a time"):
        result["quality_detectors"] = detector_cost()
    with console.status("a tiered route's choice, a request at a time"):
        tiered = TierOptions()
        result["tier_choice"] = await classifier_cost(workload(tiered, 2000, tiered.seed))
    _report(console, result)
    plots.save(console, result, options.out, options.plot, lambda path: _plot(samples, path))
    return result


@contextlib.contextmanager
def _paused(pids: list[int]) -> Iterator[None]:
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


async def _trace_sink(stack: AsyncExitStack) -> str:
    """An OTLP/HTTP endpoint that takes the traced agents' spans and drops them."""

    async def traces(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return f"http://127.0.0.1:{port}"


def _result(
    samples: dict[str, dict[str, list[float]]], throughput: dict[str, dict[str, float]]
) -> dict[str, Any]:
    base = samples["engine"]
    out: dict[str, Any] = {"results": {}, "engine": {}}
    for mode in ("plain", "stream"):
        out["engine"][f"{mode}_p50_ms"] = round(quantile(base[mode], 0.5) * 1000, 3)
        out["engine"][f"{mode}_p99_ms"] = round(quantile(base[mode], 0.99) * 1000, 3)
    out["engine"].update(throughput.get("engine", {}))  # none yet: latency alone
    for name in ROUTERS:
        mine = samples[name]
        row: dict[str, Any] = {}
        for mode in ("plain", "stream"):
            for q, label in ((0.5, "p50"), (0.99, "p99")):
                added = quantile(mine[mode], q) - quantile(base[mode], q)
                row[f"{mode}_added_{label}_ms"] = round(added * 1000, 3)
        # the headline: the worse of streamed and not
        row["added_p50_ms"] = max(row["plain_added_p50_ms"], row["stream_added_p50_ms"])
        row["added_p99_ms"] = max(row["plain_added_p99_ms"], row["stream_added_p99_ms"])
        row.update(throughput.get(name, {}))
        out["results"][name] = row
    return out


def _report(console: Console, result: dict[str, Any]) -> None:
    table = Table(title="what the router adds over a null engine (fresh connection a request)")
    columns = ("router", "added p50 ms", "added p99 ms", "streamed added p50 ms",
               "streamed added p99 ms", "req/s", "router CPU cores", "req per CPU s",
               "machine busy")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for name, r in result["results"].items():
        table.add_row(
            name, f"{r['plain_added_p50_ms']:.3f}", f"{r['plain_added_p99_ms']:.3f}",
            f"{r['stream_added_p50_ms']:.3f}", f"{r['stream_added_p99_ms']:.3f}",
            f"{r['rps']:.0f}", f"{r['cpu_cores']:.2f}", f"{r['rps_per_core']:.0f}",
            f"{r['machine_busy']:.0%}",
        )  # fmt: skip
    e = result["engine"]
    table.add_row(
        "(engine alone)", f"p50 {e['plain_p50_ms']:.3f}", f"p99 {e['plain_p99_ms']:.3f}",
        f"p50 {e['stream_p50_ms']:.3f}", f"p99 {e['stream_p99_ms']:.3f}", f"{e['rps']:.0f}",
        f"{e['cpu_cores']:.2f}", f"{e['rps_per_core']:.0f}", f"{e['machine_busy']:.0%}",
    )  # fmt: skip
    console.print(table)
    c = result["clients"]
    console.print(
        f"client to the engines, CPU µs a request: the gateway's {c['upstream_us']:.1f}, "
        f"aiohttp's {c['aiohttp_us']:.1f}"
    )
    q = result["quality_detectors"]
    plain = q["256 tokens, a whole body parsed"]
    console.print(
        "the quality guard's detectors (in the meridian rows above), CPU µs: "
        f"{plain['per_answer_us']:.1f} a non-streamed 256-token answer (parsed once more), "
        f"{q['worst_per_chunk_us']:.3f} a chunk at worst (bench/detector_cost.py)"
    )
    t = result["tier_choice"]
    console.print(
        "a tiered route's choice (classifier, conversation key, body re-encoded; only requests "
        f"to a tiered route), CPU µs a request: p50 {t['p50_us']}, p99 {t['p99_us']} "
        "(bench/tier_cost.py)"
    )


def _plot(samples: dict[str, dict[str, list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, mode in zip(axes, ("plain", "stream"), strict=True):
        for name, by_mode in samples.items():
            values = sorted(v * 1000 for v in by_mode[mode])
            ax.plot(values, [i / len(values) for i in range(len(values))], label=name)
        ax.set_xscale("log")
        ax.set_xlabel("request latency, ms (log)")
        ax.set_title("streamed" if mode == "stream" else "not streamed")
        ax.legend()
    axes[0].set_ylabel("share of requests")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
