"""`meridian bench scaledowns`: a deployment scaled down and up again, `cycles` times, under
steady streaming traffic, on a real fleet: a control plane on PostgreSQL, an agent, and the
simulated engines it starts and stops (all real processes).

Each cycle takes the deployment from 3 engines to 2 (a new revision: the agent drains the
engine that leaves, which takes no new request, and after the deployment's `drain_timeout_s`
carries the streams it still runs on to another engine), waits until that engine has
stopped, then back to 3 and waits until it is ready. Meanwhile `senders` clients each stream
one chat answer after another. A request counts as failed unless it is answered 200, every
event parses, one says why the answer finished, and `[DONE]` ends it; clients never retry.

The scale-downs here are written through the admin API (`replicas`), not by the planner's
demand: an engine count that falls reaches the agent the same way either way (a revision
with fewer engines), and this is what drains them.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bench.harness import IMMEDIATE, MODEL, apply, start_agent, start_control
from meridian.procs import free_port

REGION, DEPLOYMENT, NODE = "us-east", "llama-us-east", "us-east-1"
LEAVING = f"{DEPLOYMENT}/unified-2"  # the highest-numbered engine leaves first


@dataclass
class Options:
    cycles: int = 100
    senders: int = 8
    tokens: int = 96
    drain_s: float = 1.0  # the deployment's drain_timeout_s: streams cut then migrate
    out: Path | None = None
    root: Path = Path(".")


@dataclass
class Tally:
    sent: int = 0
    completed: int = 0
    failed: list[str] = field(default_factory=list)


def fleet_document(port: int, drain_s: float) -> dict[str, Any]:
    gpus = [{"index": i, "model": "H100-SXM-80GB", "memory_gb": 80} for i in range(3)]
    return {
        "apiVersion": "meridian/v1",
        "clouds": [{"name": "local", "provider": "onprem"}],
        "regions": [{"name": REGION, "cloud": "local", "geography": REGION, "jurisdiction": "us",
                     "gateway_url": f"http://127.0.0.1:{port}"}],
        "nodes": [{"name": NODE, "region": REGION, "hostname": "127.0.0.1", "gpus": gpus}],
        "models": [{"name": MODEL, "source": "meridian/sim", "context_length": 131072,
                    "capabilities": ["chat", "completion"], "min_gpu_memory_gb": 24}],
        "deployments": [{"name": DEPLOYMENT, "model": MODEL, "region": REGION, "backend": "sim",
                         "replicas": 3, "drain_timeout_s": drain_s,
                         "engine_args": {"slow-factor": 4}}],
        "routing_policies": [{"name": "default", "model": MODEL, "policy": "cost",
                              "max_queue": 256}],
        "tenants": [{"name": "steady", "tier": "standard"}],
        "rollout_policies": IMMEDIATE,
    }  # fmt: skip


async def _stream(http: httpx.AsyncClient, url: str, n: int, tokens: int, tally: Tally) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"a story, number {n}"}],
            "max_tokens": tokens, "stream": True}  # fmt: skip
    tally.sent += 1
    try:
        async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                tally.failed.append(
                    f"HTTP {response.status_code}: {await response.aread()!r}"[:160]
                )
                return
            done, finished = False, False
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    event = orjson.loads(line[6:])  # a torn event fails here
                    if "error" in event:
                        tally.failed.append(f"error event: {line[:150]}")
                        return
                    finished |= any(c.get("finish_reason") for c in event.get("choices", []))
            if not (done and finished):
                tally.failed.append("no finish_reason" if done else "no [DONE]")
                return
    except (httpx.HTTPError, orjson.JSONDecodeError) as error:
        tally.failed.append(f"{type(error).__name__}: {error}"[:160])
        return
    tally.completed += 1


async def _sender(
    http: httpx.AsyncClient, url: str, who: int, tokens: int, tally: Tally, stop: asyncio.Event
) -> None:
    n = 0
    while not stop.is_set():
        await _stream(http, url, who * 1_000_000 + n, tokens, tally)
        n += 1


async def _engines(http: httpx.AsyncClient, agent: str, operator: str) -> dict[str, str]:
    status = (await http.get(f"{agent}/agent/status",
                             headers={"Authorization": f"Bearer {operator}"})).json()  # fmt: skip
    return {e["id"]: e["state"] for e in status["engines"]}


async def _until(check: Any, within_s: float = 120.0) -> float:
    """Seconds until `check()` holds."""
    began = time.monotonic()
    async with asyncio.timeout(within_s):
        while not await check():  # noqa: ASYNC110 (another process's state, polled)
            await asyncio.sleep(0.1)
    return time.monotonic() - began


async def _replicas(admin: httpx.AsyncClient, n: int) -> None:
    answer = await admin.patch(f"/v1/deployments/{DEPLOYMENT}", json={"replicas": n},
                               headers={"If-Match": "*"})  # fmt: skip
    answer.raise_for_status()


async def run(options: Options) -> dict[str, Any]:
    console = Console(width=150)
    tally = Tally()
    downs: list[float] = []  # seconds from the write to the engine stopped
    async with AsyncExitStack() as stack:
        with console.status("starting a control plane, an agent and its 3 engines"):
            cp, admin = await start_control(stack, options.root,
                                            {"MERIDIAN_PLANNER_MODE": "off"})  # fmt: skip
            port = free_port()
            await apply(admin, fleet_document(port, options.drain_s))
            operator = secrets.token_urlsafe(24)
            _, url = await start_agent(stack, options.root, cp, admin, REGION, NODE, operator,
                                       port)  # fmt: skip
            made = await admin.post("/v1/api-keys", json={"tenant": "steady"})
            made.raise_for_status()
            key = made.json()["key"]
            probe = httpx.AsyncClient(timeout=10)
            stack.push_async_callback(probe.aclose)

            async def all_ready() -> bool:
                states = await _engines(probe, url, operator)
                return len(states) == 3 and set(states.values()) == {"ready"}

            await _until(all_ready)
        limits = httpx.Limits(max_connections=options.senders * 2)
        http = httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=120,
                                 limits=limits)  # fmt: skip
        stack.push_async_callback(http.aclose)
        stop = asyncio.Event()
        senders = [asyncio.create_task(_sender(http, url, i, options.tokens, tally, stop))
                   for i in range(options.senders)]  # fmt: skip
        began = time.monotonic()

        async def gone() -> bool:
            return LEAVING not in await _engines(probe, url, operator)

        async def back() -> bool:
            return (await _engines(probe, url, operator)).get(LEAVING) == "ready"

        columns = (TextColumn("scale-downs"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[said]}"), TimeElapsedColumn())  # fmt: skip
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("", total=options.cycles, said="")
            for _ in range(options.cycles):
                await asyncio.sleep(0.5)  # streams under way on every engine
                await _replicas(admin, 2)
                downs.append(await _until(gone))
                await _replicas(admin, 3)
                await _until(back)
                progress.update(task, advance=1, said=f"{tally.completed} answered, "
                                f"{len(tally.failed)} failed")  # fmt: skip
        stop.set()
        await asyncio.gather(*senders)
        migrations = await _migrations(probe, url, operator)
        result = {
            "cycles": options.cycles,
            "senders": options.senders,
            "tokens": options.tokens,
            "drain_timeout_s": options.drain_s,
            "seconds": round(time.monotonic() - began, 1),
            "requests": tally.sent,
            "completed": tally.completed,
            "failed": len(tally.failed),
            "failures": sorted(set(tally.failed))[:10],
            "migrated_streams": migrations,
            "drain_to_stop_p50_s": round(sorted(downs)[len(downs) // 2], 2),
            "drain_to_stop_max_s": round(max(downs), 2),
        }
    _report(console, result)
    if options.out is not None:
        options.out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return result


async def _migrations(http: httpx.AsyncClient, agent: str, operator: str) -> int:
    status = (await http.get(f"{agent}/agent/status",
                             headers={"Authorization": f"Bearer {operator}"})).json()  # fmt: skip
    return sum(int(m["count"]) for m in status["migrations"] if m["to"] != "ended")


def _report(console: Console, r: dict[str, Any]) -> None:
    title = (f"{r['cycles']} scale-downs (3 → 2 engines, then back) under {r['senders']} "
             f"streaming clients, drain {r['drain_timeout_s']} s")  # fmt: skip
    table = Table(title=title)
    for column in ("requests", "completed", "failed", "streams migrated",
                   "write → engine stopped p50 / max"):  # fmt: skip
        table.add_column(column, justify="right")
    table.add_row(str(r["requests"]), str(r["completed"]), str(r["failed"]),
                  str(r["migrated_streams"]),
                  f"{r['drain_to_stop_p50_s']} s / {r['drain_to_stop_max_s']} s")  # fmt: skip
    console.print(table)
    goal = "met" if r["failed"] == 0 else "missed"
    console.print(f"  {goal}: 0 failed requests over {r['cycles']} scale-downs")
    for failure in r["failures"]:
        console.print(f"  failure: {failure}")
