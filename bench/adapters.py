"""`meridian bench adapters`: tenants' LoRA adapters over two regions, side by side.

Setup: `adapters` (1,000) LoRA adapters of the model, each a PEFT directory (the tiny model's
shapes: the simulator reads its rank), for tenant `acme`; two regions of `engines` (4)
simulated engines each, with LoRA (`--max-loaded-loras` 256, `--max-loras-per-batch` 8, a
load taking `--lora-load-s`). Every engine knows every adapter from its start
(`--lora-paths`), as engines behind sglang-router must: a request naming one it does not
hold loads it first (a cold load, which the engine counts: `/sim/lora`).

Workload: chat streams into each region at `rate` a second (Poisson), 70% naming an adapter
(`llama:<adapter>`, SGLang's form) drawn Zipf(`zipf`) over them, 30% the base model; the
same requests for every contender.

Contenders, one after the other on the same engines, each from engines holding nothing:
- `round_robin`, `cache_aware`: sglang-router over each region's engines; it does not see
  adapters. Each engine first loads a quarter of the adapters (striped), as one would place
  them by hand.
- `meridian`: a control plane and one agent a region, serving the base model; then the
  adapters registered by applying the fleet document again with them; the leader's
  residency plan, adapter-aware routing (`cost`). The time from the apply until every
  engine holds what the plan puts on it is measured first (with its steps: the apply's
  answer, every agent knowing the adapters, every agent holding a plan); then the
  workload; then the workload again with an engine of the first region killed a third of
  the way in and started again (its agent loads its adapters again: the time from its
  restart until it holds what the plan puts on it now, those asked for first, and the
  requests that failed); then another tenant naming acme's adapters (it must never be
  served one). `--contenders meridian` runs Meridian alone.

Per contender: TTFT p50 and p99 of the adapter requests and of the base model's, the share of
adapter requests that waited for a load (the engines' loads in the phase over the adapter
requests), and the requests that failed.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress

from agents.engines import tiny_model
from bench.harness import (
    IMMEDIATE,
    MODEL,
    Sim,
    engine_port,
)
from bench.load import Client, Req, Result, poisson, quantile
from controlplane.snapshot.placement import KV_EVENTS_PORT_OFFSET
from meridian import procs
from meridian.procs import stop_child, wait_ready

A, B = "east", "west"
WORDS = ("sea", "salt", "wind", "tide", "ship", "fog", "gull", "reef")
TENANT, OTHER = "acme", "other"
CONTENDERS = ("round_robin", "cache_aware", "meridian")


@dataclass
class Options:
    adapters: int = 1000
    engines: int = 4  # per region
    rate: float = 6.0  # requests a second into each region
    seconds: float = 45.0
    zipf: float = 1.1
    base_share: float = 0.3
    load_s: float = 0.05
    max_loaded: int = 256
    per_batch: int = 8
    out: Path | None = None
    root: Path = Path(".")
    contenders: tuple[str, ...] = CONTENDERS


def adapter_name(i: int) -> str:
    return f"ft-{i:04d}"


def write_adapters(console: Console, root: Path, count: int) -> dict[str, Path]:
    made = {}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"writing {count} adapters", total=count)
        for i in range(count):
            name = adapter_name(i)
            made[name] = tiny_model.write_adapter(root / name, root, seed=i, rank=4)
            progress.advance(task)
    return made


def workload(o: Options, seed: int) -> list[Req]:
    """One region's requests: an adapter's by Zipf, or the base model's."""
    rng = random.Random(seed)
    weights = [k**-o.zipf for k in range(1, o.adapters + 1)]
    count = round(o.rate * o.seconds)
    picks = rng.choices(range(o.adapters), weights=weights, k=count)
    reqs = []
    for i, pick in enumerate(picks):
        model = MODEL if rng.random() < o.base_share else f"{MODEL}:{adapter_name(pick)}"
        words = " ".join(rng.choice(WORDS) for _ in range(40))
        reqs.append(Req([{"role": "user", "content": f"{i} {words}"}], 24, model=model))
    return reqs


@dataclass
class LoraSim:
    sim: Sim
    args: list[str]
    port: int


async def start_lora_sims(
    stack: AsyncExitStack, o: Options, paths: dict[str, Path], count: int
) -> list[LoraSim]:
    known: list[str] = []
    for name, path in paths.items():
        known += ["--lora-paths", f"{name}={path}"]
    out = []
    for i in range(count):
        port = engine_port()
        endpoint = f"tcp://127.0.0.1:{port + KV_EVENTS_PORT_OFFSET}"
        events = json.dumps({"publisher": "zmq", "endpoint": endpoint, "topic": "kv-events"})
        args = ["--model", MODEL, "--enable-metrics", "--enable-cache-report",
                "--kv-events-config", events, "--enable-lora", "--max-lora-rank", "8",
                "--lora-target-modules", "all", "--max-loaded-loras", str(o.max_loaded),
                "--max-loras-per-batch", str(o.per_batch), "--lora-load-s", str(o.load_s),
                *known]  # fmt: skip
        child = await procs.start_sim(args, port=port, log=o.root / f"sim-{i}.log",
                                      ready_timeout_s=None)  # fmt: skip
        stack.push_async_callback(_stop_later, child)
        out.append(LoraSim(Sim(child.process, child.url, 1.0), args, port))
    for s in out:
        await wait_ready(s.sim.url, s.sim.process, 60, path="/ready", what="a simulator")
    return out


async def _stop_later(child: Any) -> None:
    await stop_child(child.process)


async def loads(http: httpx.AsyncClient, sims: list[LoraSim]) -> int:
    total = 0
    for s in sims:
        total += int((await http.get(f"{s.sim.url}/sim/lora")).json()["loads"])
    return total


async def reset(http: httpx.AsyncClient, sims: list[LoraSim]) -> None:
    """Every engine's adapters unloaded and its cache flushed."""
    for s in sims:
        for name in (await http.get(f"{s.sim.url}/sim/lora")).json()["loaded"]:
            await http.post(f"{s.sim.url}/unload_lora_adapter", json={"lora_name": name})
        await http.post(f"{s.sim.url}/flush_cache")


async def stripe(http: httpx.AsyncClient, sims: list[LoraSim], paths: dict[str, Path]) -> None:
    """Engine j of a region loads every adapter i with i % engines == j, as placed by hand."""

    async def one(j: int, s: LoraSim) -> None:
        for i, (name, path) in enumerate(paths.items()):
            if i % len(sims) == j:
                await http.post(f"{s.sim.url}/load_lora_adapter",
                                json={"lora_name": name, "lora_path": str(path)})  # fmt: skip

    await asyncio.gather(*(one(j, s) for j, s in enumerate(sims)))


def summary(results: list[Result], reqs: list[Req], engine_loads: int) -> dict[str, Any]:
    adapter = [r for q, r in zip(reqs, results, strict=True) if q.model != MODEL]
    base = [r for q, r in zip(reqs, results, strict=True) if q.model == MODEL]

    def ttft(rs: list[Result], q: float) -> float:
        return round(quantile([r.ttft_s for r in rs if r.status == 200], q), 4)

    a99, b99 = ttft(adapter, 0.99), ttft(base, 0.99)
    return {
        "requests": len(results), "adapter_requests": len(adapter),
        "failed": sum(r.status != 200 for r in results),
        "not_loaded_400": sum(r.status == 400 for r in results),
        "adapter_ttft_p50_s": ttft(adapter, 0.5), "adapter_ttft_p99_s": a99,
        "base_ttft_p50_s": ttft(base, 0.5), "base_ttft_p99_s": b99,
        "p99_ratio": round(a99 / b99, 2) if b99 else None,
        "engine_loads": engine_loads,
        "stall_share": round(engine_loads / max(1, len(adapter)), 4),
    }  # fmt: skip


async def phase(
    client: Client, urls: dict[str, str], reqs: dict[str, list[Req]], rate: float, seed: int
) -> list[Result]:
    """Each region's requests into its own URL, at the same time."""

    def to(url: str) -> Callable[[int], str]:
        return lambda _i: url

    runs = [poisson(client, to(urls[r]), reqs[r], rate, seed + n) for n, r in enumerate((A, B))]
    done = await asyncio.gather(*runs)
    return [result for results, _ in done for result in results]


def fleet_document(o: Options, urls: dict[str, list[str]], ports: dict[str, int],
                   paths: dict[str, Path]) -> dict[str, Any]:  # fmt: skip
    args = {"max-loaded-loras": o.max_loaded, "max-loras-per-batch": o.per_batch}
    return {
        "apiVersion": "meridian/v1",
        "clouds": [{"name": "local", "provider": "onprem"}],
        "regions": [{"name": r, "cloud": "local", "geography": r, "jurisdiction": "local",
                     "gateway_url": f"http://127.0.0.1:{ports[r]}"} for r in (A, B)],
        "nodes": [{"name": f"{r}-1", "region": r, "hostname": "127.0.0.1"} for r in (A, B)],
        "models": [{"name": MODEL, "source": "meridian/sim", "context_length": 131072,
                    "capabilities": ["chat", "completion"]}],
        "deployments": [{"name": f"{r}-sims", "model": MODEL, "region": r,
                         "backend": "external", "external_urls": urls[r], "engine_args": args}
                        for r in (A, B)],
        "routing_policies": [{"name": r, "model": MODEL, "region": r, "policy": "cost"}
                             for r in (A, B)],
        "fallback_rules": [{"name": f"{r}-out", "region": r, "peers": [p],
                            "triggers": ["overload", "failure"]}
                           for r, p in ((A, B), (B, A))],
        "tenants": [{"name": t, "tier": "standard", "requests_per_minute": 1_000_000,
                     "tokens_per_minute": 1_000_000_000} for t in (TENANT, OTHER)],
        "adapters": [{"name": n, "base_model": MODEL, "rank": 4, "source": str(p),
                      "tenants": [TENANT]} for n, p in paths.items()],
        "rollout_policies": IMMEDIATE,
    }  # fmt: skip
