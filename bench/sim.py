"""`meridian bench sim`: the simulator against its calibration, and what it costs to run.

Calibration: one simulator, measured the way the published figure was measured
(sgl-project/sglang PR #1060: 8192 random input tokens, 8 output tokens, every request sent
at once, no cache hits), beside the published number. Footprint: N simulators and this
process as the load generator, all on this machine; CPU and resident memory from /proc.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from agents.engines.sim.cost import CostModel
from bench.procfs import cpu_seconds, rss_mb
from meridian import procs
from meridian.procs import stop_child, wait_ready

PUBLISHED_PREFILL_TOK_S = 27_670.26  # sglang PR #1060, Llama-3.1-8B-Instruct, one H100


@dataclass
class Sim:
    process: asyncio.subprocess.Process
    url: str


async def start_sims(count: int, *extra: str) -> list[Sim]:
    sims = []
    for _ in range(count):
        child = await procs.start_sim(["--model", "llama", *extra], ready_timeout_s=None)
        sims.append(Sim(child.process, child.url))
    for sim in sims:  # started together, awaited together
        await wait_ready(sim.url, sim.process, 20, path="/ready", what="a simulator")
    return sims


async def calibration(client: httpx.AsyncClient, sim: Sim, prompts: int) -> dict[str, float]:
    rng = random.Random(1)
    bodies = [
        {"input_ids": [rng.randrange(300, 120_000) for _ in range(8192)],
         "sampling_params": {"max_new_tokens": 8}}
        for _ in range(prompts)
    ]  # fmt: skip
    started = time.perf_counter()
    answers = await asyncio.gather(*(client.post(f"{sim.url}/generate", json=b) for b in bodies))
    elapsed = time.perf_counter() - started
    cached = sum(a.json()["meta_info"]["cached_tokens"] for a in answers)
    one = {"text": "hello " * 1000, "sampling_params": {"max_new_tokens": 256}, "stream": True}
    gaps, last = [], None
    async with client.stream("POST", f"{sim.url}/generate", json=one) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now
    return {
        "input_tok_s": prompts * 8192 / elapsed,
        "cached_tokens": cached,
        "itl_ms_p50": statistics.median(gaps) * 1000,
    }


async def footprint(sims: list[Sim], concurrency: int, seconds: float) -> dict[str, Any]:
    pids = [s.process.pid for s in sims]
    me = os.getpid()
    cpu_before = {p: cpu_seconds(p, children=False) for p in [*pids, me]}
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds
    rng = random.Random(2)
    prefixes = [" ".join(f"system{i} rule{j}" for j in range(200)) for i in range(4)]

    async def worker(index: int, client: httpx.AsyncClient) -> None:
        nonlocal errors
        sim = sims[index % len(sims)]
        while time.perf_counter() < stop_at:
            text = f"{rng.choice(prefixes)} question {rng.randrange(10**6)}"
            body = {"text": text, "sampling_params": {"max_new_tokens": 64}}
            started = time.perf_counter()
            response = await client.post(f"{sim.url}/generate", json=body)
            if response.status_code == 200:
                latencies.append(time.perf_counter() - started)
            else:
                errors += 1

    limits = httpx.Limits(max_connections=concurrency)
    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        await asyncio.gather(*(worker(i, client) for i in range(concurrency)))
    elapsed = time.perf_counter() - started
    cpu = {p: cpu_seconds(p, children=False) - cpu_before[p] for p in cpu_before}
    return {
        "engines": len(sims),
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": errors,
        "requests_per_s": len(latencies) / elapsed,
        "e2e_p50_ms": statistics.median(latencies) * 1000 if latencies else 0.0,
        "sim_cpu_cores": sum(cpu[p] for p in pids) / elapsed,
        "loadgen_cpu_cores": cpu[me] / elapsed,
        "sim_rss_mb_each": max(rss_mb(p)[0] for p in pids),
    }


async def run(engines: int, concurrency: int, seconds: float, out: Path | None) -> None:
    console = Console()
    model = CostModel()
    sims = await start_sims(engines)
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            console.print("calibration: 16 prompts of 8192 random tokens, 8 output tokens each")
            calib = await calibration(client, sims[0], 16)
        console.print(f"footprint: {engines} simulators, {concurrency} clients, {seconds:.0f} s")
        foot = await footprint(sims, concurrency, seconds)
    finally:
        await asyncio.gather(*(stop_child(s.process, 5) for s in sims))
    table = Table(title="calibration (Llama-3.1-8B, one H100)")
    for column in ("figure", "published / modelled", "simulator"):
        table.add_column(column)
    table.add_row(
        "prefill, input tok/s",
        f"{PUBLISHED_PREFILL_TOK_S:,.0f} (PR #1060)",
        f"{calib['input_tok_s']:,.0f}",
    )
    table.add_row("cached tokens (random prompts)", "0", f"{calib['cached_tokens']:.0f}")
    table.add_row(
        "batch-1 ITL ms (p50)",
        f"{model.decode_step(1, 1128) * 1000:.2f} (modelled)",
        f"{calib['itl_ms_p50']:.2f}",
    )
    console.print(table)
    table = Table(title="footprint on this machine")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in foot.items():
        table.add_row(
            key.replace("_", " "), f"{value:,.2f}" if isinstance(value, float) else str(value)
        )
    console.print(table)
    if out is not None:
        document = json.dumps({"calibration": calib, "footprint": foot}, indent=2) + "\n"
        await asyncio.to_thread(out.write_text, document)
