"""`meridian bench revocation`: from the DELETE of an API key to the key failing in every region.

A control plane on an embedded PostgreSQL and one agent per region, all real processes. Each
round makes a key, waits until every region takes it, deletes it through the admin API, and
polls every region's gateway (every 2 ms, with the key) until it answers 401; the time from
the start of the DELETE to that answer is the round's figure for the region.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.harness import apply, start_agent, start_control
from bench.plots import write_json
from meridian.procs import free_port

GOAL_P99_S = 1.0
POLL_S = 0.002


@dataclass
class Options:
    regions: int = 3
    rounds: int = 20
    out: Path | None = None
    root: Path = Path(".")


def fleet_document(regions: list[str], ports: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "meridian/v1",
        "clouds": [{"name": "local", "provider": "onprem"}],
        "regions": [{"name": r, "cloud": "local", "geography": r, "jurisdiction": "local",
                     "gateway_url": f"http://127.0.0.1:{ports[r]}"} for r in regions],
        "nodes": [{"name": f"{r}-1", "region": r, "hostname": "127.0.0.1"} for r in regions],
        "tenants": [{"name": "bench", "tier": "standard"}],
    }  # fmt: skip


async def run(options: Options) -> dict[str, Any]:
    console = Console(width=120)
    regions = [f"region-{i + 1}" for i in range(options.regions)]
    times: dict[str, list[float]] = {r: [] for r in regions}
    deletes: list[float] = []
    async with AsyncExitStack() as stack:
        with console.status(f"starting a control plane and {len(regions)} regions' agents"):
            cp, admin = await start_control(stack, options.root)
            ports = {r: free_port() for r in regions}
            await apply(admin, fleet_document(regions, ports))
            operator = secrets.token_urlsafe(24)
            for r in regions:
                await start_agent(stack, options.root, cp, admin, r, f"{r}-1", operator, ports[r])
        gateways = {r: f"http://127.0.0.1:{ports[r]}" for r in regions}
        async with httpx.AsyncClient(timeout=5) as http:
            with console.status("rounds") as status:
                for n in range(options.rounds):
                    status.update(f"round {n + 1} of {options.rounds}")
                    made = await admin.post("/v1/api-keys", json={"tenant": "bench"})
                    made.raise_for_status()
                    name, key = made.json()["name"], made.json()["key"]
                    await asyncio.gather(*(_until(http, g, key, 200) for g in gateways.values()))
                    started = time.monotonic()
                    gone = asyncio.create_task(
                        admin.delete(f"/v1/api-keys/{name}", headers={"If-Match": "*"})
                    )
                    failed = await asyncio.gather(
                        *(_until(http, g, key, 401) for g in gateways.values())
                    )
                    (await gone).raise_for_status()
                    deletes.append(time.monotonic() - started)
                    for r, at in zip(regions, failed, strict=True):
                        times[r].append(at - started)
    everything = sorted(t for ts in times.values() for t in ts)
    result = {
        "regions": options.regions,
        "rounds": options.rounds,
        "goal_p99_s": GOAL_P99_S,
        "all": _summary(everything),
        "by_region": {r: _summary(sorted(ts)) for r, ts in times.items()},
        "delete_answered": _summary(sorted(deletes)),
    }
    _report(console, result)
    write_json(console, result, options.out)
    return result


async def _until(http: httpx.AsyncClient, gateway: str, key: str, status: int) -> float:
    """When the gateway first answered `status` to the key (monotonic clock)."""
    deadline = time.monotonic() + 30
    while True:
        answer = await http.get(f"{gateway}/v1/models", headers={"Authorization": f"Bearer {key}"})
        if answer.status_code == status:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{gateway} still answers {answer.status_code}, not {status}")
        await asyncio.sleep(POLL_S)


def _summary(values: list[float]) -> dict[str, float]:
    def at(q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))]

    return {
        "samples": len(values),
        "p50_s": round(at(0.5), 4),
        "p99_s": round(at(0.99), 4),
        "max_s": round(values[-1], 4),
    }


def _report(console: Console, result: dict[str, Any]) -> None:
    table = Table(title="from the DELETE of an API key to the key failing (401) in a region")
    for column in ("where", "samples", "p50 s", "p99 s", "max s"):
        table.add_column(column, justify="right")
    rows = {**result["by_region"], "every region": result["all"]}
    for where, s in rows.items():
        table.add_row(where, str(s["samples"]), f"{s['p50_s']:.3f}", f"{s['p99_s']:.3f}",
                      f"{s['max_s']:.3f}")  # fmt: skip
    d = result["delete_answered"]
    table.add_row("(the DELETE answered)", str(d["samples"]), f"{d['p50_s']:.3f}",
                  f"{d['p99_s']:.3f}", f"{d['max_s']:.3f}")  # fmt: skip
    console.print(table)
    p99 = result["all"]["p99_s"]
    verdict = "met" if p99 <= result["goal_p99_s"] else "NOT met"
    console.print(f"goal: p99 ≤ {result['goal_p99_s']} s in every region: {verdict} ({p99:.3f} s)")
