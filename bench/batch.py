"""`meridian bench batch`: a batch of many lines over three regions, on the slack their own
interactive traffic leaves, following the sun.

Three regions, each with its own simulated engines and agent, one control plane. The
regions' local times are set (`utc_offset_h`) so that, when the benchmark runs, one is in its
night, one in its morning and one in its afternoon. In each region a tenant's interactive
traffic runs at a steady rate (Poisson, the overload benchmark's workload).

- `baseline`: the interactive traffic alone, for `baseline_s`: its SLO misses are what the
  regions miss without batch work (a rate of misses near zero needs many requests to be
  known).
- `batch`: the same interactive traffic, while a batch of `lines` lines (the `nightly`
  tenant's, resident in all three regions) is made with the Batch API and run to its end by
  the control plane's batch runner, as `batch`-class requests. Its interactive traffic runs
  steady until the batch has ended. (It once ran in rounds of 30 s, each sent after the
  last had ended: the lulls between them, 5 to 7 s of no interactive traffic, were slack the
  night region's batch filled, and the next round's first requests met it.)

Reported: the batch's time to completion and lines each region answered, throughput per
region by local hour (the regions' local clocks, from each line's answer time), and each
region's interactive SLO misses with the batch against the baseline's rate (the misses the
batch may be blamed for are those above it). Goals (issue 43): every line answered exactly
once; no interactive SLO miss attributable to batch.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import func, select

from bench import batch_load, plots, procfs, routing
from bench.batch_report import ITL_S, TTFT_S, attribute, errors, misses, misses_in_time, report
from bench.classes import histograms, histograms_since, seen_by_class
from bench.harness import IMMEDIATE, MODEL, apply, start_agent, start_control_on_db, start_sims
from bench.load import Client, Result, poisson
from controlplane.db.batch_rows import BatchLineRow
from controlplane.db.engine import Database
from meridian.procs import free_port

REGIONS = (("night", 2), ("morning", 9), ("afternoon", 15))  # (name, local hour now)
SLO = {"slo_ttft_ms": 2000, "slo_itl_ms": 50, "max_queue": 1024}
BATCH_AT_MOST_S = 3600.0  # interactive traffic runs beside the batch until it ends, this at most


@dataclass
class Options:
    lines: int = 10_000
    engines: int = 2  # per region
    interactive_rps: float = 6.0  # per region
    baseline_s: float = 120.0  # of interactive traffic alone
    max_tokens: int = 32  # each line's answer
    speed: float = 0.5
    out: Path | None = None
    root: Path = Path(".")


def offset_for(local_hour: int, now: datetime) -> float:
    """The UTC offset (hours, in -12..14) that makes it `local_hour` now."""
    return float((local_hour - now.hour + 12) % 24 - 12)


def fleet_document(
    sims: dict[str, list[str]], ports: dict[str, int], offsets: dict[str, float]
) -> dict[str, Any]:
    return {
        "apiVersion": "meridian/v1",
        "clouds": [{"name": "local", "provider": "onprem"}],
        "regions": [{"name": r, "cloud": "local", "geography": r, "jurisdiction": r,
                     "gateway_url": f"http://127.0.0.1:{ports[r]}", "utc_offset_h": offsets[r]}
                    for r in sims],
        "nodes": [{"name": f"{r}-1", "region": r, "hostname": "127.0.0.1"} for r in sims],
        "models": [{"name": MODEL, "source": "meridian/sim", "context_length": 131072,
                    "capabilities": ["chat", "completion"]}],
        "deployments": [{"name": f"{r}-sims", "model": MODEL, "region": r,
                         "backend": "external", "external_urls": urls}
                        for r, urls in sims.items()],
        "routing_policies": [{"name": r, "model": MODEL, "region": r, "policy": "cost",
                              "params": {"kv_events": False}, **SLO} for r in sims],
        "tenants": [
            {"name": "chat", "tier": "standard", "default_class": "interactive",
             "class_ceiling": "interactive"},
            {"name": "nightly", "tier": "standard", "default_class": "batch",
             "class_ceiling": "batch", "allowed_jurisdictions": list(sims)},
        ],
        "rollout_policies": IMMEDIATE,
    }  # fmt: skip


def batch_input(lines: int, max_tokens: int) -> bytes:
    return b"".join(
        orjson.dumps({"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": MODEL, "max_tokens": max_tokens, "messages": [
                          {"role": "user", "content": f"summarise item {n} of the archive"}]}})
        + b"\n"
        for n in range(lines)
    )  # fmt: skip


async def run(options: Options) -> dict[str, Any]:
    console = Console(width=150)
    now = datetime.now(UTC)
    offsets = {name: offset_for(hour, now) for name, hour in REGIONS}
    o = routing.Options(workers=options.engines, speed=options.speed, root=options.root)
    workload = o.workload()
    result: dict[str, Any] = {"lines": options.lines, "offsets_h": offsets, "results": {}}
    async with AsyncExitStack() as stack:
        with console.status("starting simulators, a control plane and three regions"):
            count = options.engines * len(REGIONS)
            started = await start_sims(
                stack, count, max_total_tokens=o.pool_tokens, stream_interval=o.stream_interval,
                speeds=[o.speed] * count, log_dir=options.root,
            )  # fmt: skip
            sims = {name: [s.url for s in started[i * options.engines:(i + 1) * options.engines]]
                    for i, (name, _) in enumerate(REGIONS)}  # fmt: skip
            cp, admin, database_url = await start_control_on_db(stack, options.root)
            ports = {name: free_port() for name in sims}
            await apply(admin, fleet_document(sims, ports, offsets))
            operator = secrets.token_urlsafe(24)
            for name in sims:
                await start_agent(stack, options.root, cp, admin, name, f"{name}-1", operator,
                                  ports[name])  # fmt: skip
            keys = {}
            for tenant in ("chat", "nightly"):
                made = await admin.post("/v1/api-keys", json={"tenant": tenant})
                made.raise_for_status()
                keys[tenant] = made.json()["key"]
        urls = {name: f"http://127.0.0.1:{ports[name]}" for name in sims}
        chat = Client({"Authorization": f"Bearer {keys['chat']}"})
        stack.push_async_callback(chat.close)

        async def interactive(
            seed: int, seconds: float, until: asyncio.Future[Any] | None = None
        ) -> dict[str, list[Result]]:
            """Each region's interactive traffic, side by side and steady, for `seconds` or
            until `until` is done."""
            count = round(options.interactive_rps * seconds)
            streams = await asyncio.gather(*(
                poisson(chat, partial(_same, url), routing._subset(workload, count, seed + i),
                        options.interactive_rps, seed + i, until)
                for i, url in enumerate(urls.values())
            ))  # fmt: skip
            return {name: results for name, (results, _) in zip(urls, streams, strict=True)}

        rate = f"{options.interactive_rps:g} rps a region"
        console.print(f"[bold]baseline[/]: interactive alone, {rate}, {options.baseline_s:g} s")
        baseline = await interactive(seed=1, seconds=options.baseline_s)
        result["results"]["baseline"] = {n: misses(r) for n, r in baseline.items()}
        plots.write_json(console, result, options.out)

        console.print(f"[bold]batch[/]: {options.lines} lines, the same interactive traffic")
        made_at = time.monotonic()
        engines = {name: started[i * options.engines:(i + 1) * options.engines]
                   for i, name in enumerate(urls)}  # fmt: skip
        before = {n: await histograms(u, operator, engines[n]) for n, u in urls.items()}
        batch_id = await _create(cp.url, keys["nightly"], options.lines, options.max_tokens)
        ended = asyncio.create_task(_follow(cp.url, keys["nightly"], batch_id, console))
        busy = asyncio.create_task(_machine_busy(ended))
        load = asyncio.create_task(batch_load.sample(urls, operator, engines, made_at, ended))
        with_batch = await interactive(seed=100, seconds=BATCH_AT_MOST_S, until=ended)
        batch = await ended
        took = time.monotonic() - made_at
        result["machine_busy_by_10_s"] = await busy
        samples = await load
        after = {n: await histograms(u, operator, engines[n]) for n, u in urls.items()}
        outcomes = {n: await _class_outcomes(u, operator) for n, u in urls.items()}
        seen = {n: histograms_since(after[n], before[n]) for n in urls}
        lines = await _lines(database_url, batch_id, offsets)
        result["results"]["batch"] = {
            "batch": batch, "seconds": round(took, 1),
            "lines_per_s": round(options.lines / took, 1),
            # where interactive waited: the agent's admission, and the engines' first token
            "interactive": {n: misses(r) | seen_by_class(seen[n], "interactive", TTFT_S)
                            | {"misses_by_10_s": misses_in_time(r, made_at),
                               "load_by_10_s": batch_load.by_10_s(samples[n]),
                               "missed": [(round(x.sent_at - made_at, 2), x.status,
                                           round(x.ttft_s, 3)) for x in r
                                          if not x.meets(TTFT_S, ITL_S)],
                               "class_outcomes": outcomes[n]}
                            for n, r in with_batch.items()},
            **lines,
        }  # fmt: skip
    attribute(result)
    report(console, result)
    plots.write_json(console, result, options.out)
    return result


def _same(url: str, _: int) -> str:
    return url


async def _create(base: str, key: str, lines: int, max_tokens: int) -> str:
    async with openai.AsyncOpenAI(api_key=key, base_url=f"{base}/v1", max_retries=2) as client:
        uploaded = await client.files.create(
            file=("archive.jsonl", batch_input(lines, max_tokens)), purpose="batch"
        )
        made = await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    return made.id


async def _follow(base: str, key: str, batch_id: str, console: Console) -> dict[str, Any]:
    """Polled until it ends, with its progress shown; what `GET /v1/batches/{id}` said."""
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
               "{task.total} lines"), TimeElapsedColumn())  # fmt: skip
    async with openai.AsyncOpenAI(api_key=key, base_url=f"{base}/v1", max_retries=5) as client:
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task(batch_id, total=None)
            while True:
                batch = await client.batches.retrieve(batch_id)
                counts = batch.request_counts
                if counts is not None:
                    progress.update(task, total=counts.total,
                                    completed=counts.completed + counts.failed)  # fmt: skip
                if batch.status in ("completed", "failed", "expired", "cancelled"):
                    output = b""
                    if batch.output_file_id:
                        output = (await client.files.content(batch.output_file_id)).content
                    answered = Counter(orjson.loads(line)["custom_id"]
                                       for line in output.splitlines() if line)  # fmt: skip
                    error_file = b""
                    if batch.error_file_id:
                        error_file = (await client.files.content(batch.error_file_id)).content
                    return {
                        "status": batch.status,
                        "completed": counts.completed if counts else 0,
                        "failed": counts.failed if counts else 0,
                        "answered_once": sum(1 for n in answered.values() if n == 1),
                        "answered_twice_or_more": sum(1 for n in answered.values() if n > 1),
                        "errors": errors(error_file),
                    }
                await asyncio.sleep(1.0)


async def _lines(database_url: str, batch_id: str, offsets: dict[str, float]) -> dict[str, Any]:
    """Lines answered by region, and by region and local hour (from each line's answer
    time, on the region's clock)."""
    db = Database.connect(database_url, pool_size=1)
    try:
        async with db.sessions() as session:
            rows = (await session.execute(
                select(BatchLineRow.region, BatchLineRow.answered_at, func.count())
                .where(BatchLineRow.batch_id == batch_id, BatchLineRow.state == "done")
                .group_by(BatchLineRow.region, BatchLineRow.answered_at)
            )).all()  # fmt: skip
    finally:
        await db.close()
    by_region: Counter[str] = Counter()
    by_hour: dict[str, Counter[str]] = {}
    first = min((at for _, at, _ in rows if at is not None), default=None)
    last = max((at for _, at, _ in rows if at is not None), default=None)
    for region, at, n in rows:
        by_region[str(region)] += n
        if at is not None:
            local = at + timedelta(hours=offsets.get(str(region), 0.0))
            by_hour.setdefault(str(region), Counter())[f"{local.hour:02d}:00"] += n
    span = (last - first).total_seconds() if first and last else 0.0
    return {
        "by_region": dict(by_region),
        "by_local_hour": {r: dict(c) for r, c in by_hour.items()},
        "per_region_lines_per_s": {
            r: round(n / span, 1) if span else 0.0 for r, n in by_region.items()
        },
    }


async def _machine_busy(until: asyncio.Task[Any]) -> dict[int, float]:
    """The machine's cores' busy share in each 10 s until `until` ends: on a shared machine,
    misses in a spell when every core was busy may be the machine's, not the batch's."""
    shares: dict[int, float] = {}
    at, (busy, total) = 0, procfs.machine_busy()
    while not until.done():
        await asyncio.wait({until}, timeout=10)
        now_busy, now_total = procfs.machine_busy()
        shares[at] = round((now_busy - busy) / max(1, now_total - total), 3)
        at, busy, total = at + 10, now_busy, now_total
    return shares


async def _class_outcomes(url: str, operator: str) -> dict[str, int]:
    """The agent's requests by class and what became of them (meridian_class_requests)."""
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{url}/metrics",
                               headers={"Authorization": f"Bearer {operator}"})).text  # fmt: skip
    return {
        f"{sample.labels['class']} {sample.labels['outcome']}": int(sample.value)
        for family in text_string_to_metric_families(text)
        if family.name == "meridian_class_requests"
        for sample in family.samples
        if sample.name.endswith("_total")
    }
