"""`meridian bench migration`: streams whose engines are killed mid-answer.

Two regions of one control plane, each with its agent and its own simulators; A's fallback
rule names B (failure). In one run, with the same prompts each time:
- **baseline**: `streams` concurrent chat streams through A, nothing killed: each answer's text;
- **engine kill**: the same, and once every stream has begun, one of A's engines is killed
  (SIGKILL): its streams go on on A's other engines;
- **region kill**: the same, and every engine of A left is killed: the streams go on in B.

For each kill it reports the streams that completed (one `[DONE]`, no error event), those
equal token for token to the baseline, those that failed, the migrations the agent counted,
and the added time to the next token at the cut: each cut stream's longest gap between events
after the kill, less its median gap before it (p50 and p99).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import statistics
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from rich.console import Console
from rich.table import Table

from bench import escalation
from bench.harness import MODEL, Sim, apply, start_agent, start_control, start_sims
from bench.load import quantile
from meridian.procs import free_port

A, B = escalation.A, escalation.B


@dataclass
class Options:
    streams: int = 40
    tokens: int = 96
    workers: int = 3  # A's engines; B has one
    out: Path | None = None
    root: Path = Path(".")


@dataclass
class Stream:
    text: str = ""
    times: list[float] = field(default_factory=list)  # of each event with content
    done: bool = False
    error: str = ""


async def _one(http: httpx.AsyncClient, url: str, n: int, tokens: int, out: Stream) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"story {n}, please"}],
            "max_tokens": tokens, "stream": True}  # fmt: skip
    try:
        async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                out.error = f"HTTP {response.status_code}"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    out.done = not out.error
                    continue
                doc = orjson.loads(line[6:])
                if "error" in doc:
                    out.error = str(doc["error"].get("message", "error"))[:120]
                    continue
                choices = doc.get("choices") or []
                content = (choices[0].get("delta") or {}).get("content") if choices else None
                if content:
                    out.text += content
                    out.times.append(time.monotonic())
    except httpx.HTTPError as error:
        out.error = f"{type(error).__name__}: {error}"[:120]


async def _phase(
    http: httpx.AsyncClient, url: str, options: Options, kill: list[Sim] | None
) -> tuple[list[Stream], float]:
    streams = [Stream() for _ in range(options.streams)]
    tasks = [asyncio.ensure_future(_one(http, url, n, options.tokens, s))
             for n, s in enumerate(streams)]  # fmt: skip
    killed_at = 0.0
    if kill:
        async with asyncio.timeout(60):
            while not all(s.times or s.error for s in streams):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        killed_at = time.monotonic()
        for sim in kill:
            os.kill(sim.process.pid, signal.SIGKILL)
    await asyncio.gather(*tasks)
    return streams, killed_at


def _gaps(streams: list[Stream], killed_at: float) -> list[float]:
    """Per stream cut by the kill: its longest gap after the kill, less its usual gap."""
    added = []
    for s in streams:
        before = [b - a for a, b in zip(s.times, s.times[1:], strict=False) if b <= killed_at]
        after = [b - a for a, b in zip(s.times, s.times[1:], strict=False) if b > killed_at]
        if before and after and s.times[-1] > killed_at:
            usual = statistics.median(before)
            if max(after) > 3 * usual:  # this one was cut
                added.append(max(after) - usual)
    return added


async def _migrations(http: httpx.AsyncClient, agent: str, operator: str) -> int:
    status = (await http.get(f"{agent}/agent/status",
                             headers={"Authorization": f"Bearer {operator}"})).json()  # fmt: skip
    return sum(int(m["count"]) for m in status["migrations"] if m["to"] != "ended")


async def run(options: Options) -> dict[str, Any]:
    console = Console(width=150)
    result: dict[str, Any] = {"streams": options.streams, "tokens": options.tokens}
    async with AsyncExitStack() as stack:
        with console.status("starting simulators, a control plane and two regions"):
            sims = await start_sims(
                stack, options.workers + 1, max_total_tokens=200_000, stream_interval=1,
                log_dir=options.root, extra=("--slow-factor", "4"),
            )  # fmt: skip
            sims_a, sims_b = sims[:-1], sims[-1:]
            cp, admin = await start_control(stack, options.root)
            ports = {A: free_port(), B: free_port()}
            doc = escalation.fleet_document(sims_a, sims_b, ports)
            doc["tenants"].append({"name": "anywhere", "tier": "standard"})
            doc["fallback_rules"] = [{**escalation.RULE, "triggers": ["failure"]}]
            await apply(admin, doc)
            operator = secrets.token_urlsafe(24)
            urls = {}
            for name in (A, B):
                _, urls[name] = await start_agent(
                    stack, options.root, cp, admin, name, f"{name}-1", operator, ports[name]
                )
            made = await admin.post("/v1/api-keys", json={"tenant": "anywhere"})
            made.raise_for_status()
            key = made.json()["key"]
        limits = httpx.Limits(max_connections=options.streams * 2)
        http = httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=120,
                                 limits=limits)  # fmt: skip
        stack.push_async_callback(http.aclose)
        await _ready(http, urls[A])
        baseline, _ = await _phase(http, urls[A], options, None)
        expected = [s.text for s in baseline]
        result["baseline_failed"] = sum(not s.done for s in baseline)
        for name, doomed in (("engine_kill", sims_a[:1]), ("region_kill", sims_a[1:])):
            with console.status(f"{name}: {options.streams} streams, then kill -9"):
                before = await _migrations(http, urls[A], operator)
                streams, killed_at = await _phase(http, urls[A], options, doomed)
                migrated = await _migrations(http, urls[A], operator) - before
            gaps = _gaps(streams, killed_at)
            result[name] = {
                "completed": sum(s.done for s in streams),
                "identical": sum(s.done and s.text == e for s, e in zip(streams, expected,
                                                                       strict=True)),
                "failed": sum(not s.done for s in streams),
                "migrated": migrated,
                "gap_p50_s": round(quantile(gaps, 0.5), 3) if gaps else None,
                "gap_p99_s": round(quantile(gaps, 0.99), 3) if gaps else None,
                "errors": sorted({s.error for s in streams if s.error})[:3],
            }  # fmt: skip
    _report(console, result)
    if options.out is not None:
        options.out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return result


async def _ready(http: httpx.AsyncClient, url: str) -> None:
    """Until the region answers (its snapshot applied, its engines seen)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "warm"}], "max_tokens": 2}
    async with asyncio.timeout(60):
        for _ in range(200):  # another process turns ready: polled
            if (await http.post(f"{url}/v1/chat/completions", json=body)).status_code == 200:
                return
            await asyncio.sleep(0.3)


def _report(console: Console, result: dict[str, Any]) -> None:
    table = Table(title=f"migration: {result['streams']} chat streams of {result['tokens']} "
                        "tokens, engines killed (kill -9) once every stream has begun")  # fmt: skip
    for column in ("kill", "completed", "identical to baseline", "failed", "migrations",
                   "gap p50 s", "gap p99 s"):  # fmt: skip
        table.add_column(column, justify="right")
    for name in ("engine_kill", "region_kill"):
        r = result[name]
        table.add_row(
            name.replace("_", " "), f"{r['completed']}/{result['streams']}",
            str(r["identical"]), str(r["failed"]), str(r["migrated"]),
            str(r["gap_p50_s"]), str(r["gap_p99_s"]),
        )  # fmt: skip
    console.print(table)
    console.print("gap: the added time to the next token at the cut (goal p99 ≤ 1 s); "
                  f"baseline failures: {result['baseline_failed']}")  # fmt: skip
    for name in ("engine_kill", "region_kill"):
        if result[name]["errors"]:
            console.print(f"{name} errors: {result[name]['errors']}")
