"""`meridian bench escalation`: region A overloaded or dying beside an idle peer B.

Two regions of one control plane, each with its agent and its own simulators; A's fallback
rule names B (overload and failure). In one run:
- A's capacity, measured by the routing benchmark's sweep with escalation off;
- A at 1x, 2x and 5x that capacity, with the rule and without it: goodput (requests a second
  within the SLO), TTFT p99 of the served requests, the share refused (429/503), and the share
  B served;
- the share escalated while A has room (at half its capacity; the goal is none);
- a tenant whose residency excludes B's jurisdiction at 5x: the share B served (must be none);
- A's engines killed (SIGKILL) under traffic at half its capacity: the time from the kill to
  the first answer B served, and the requests that failed.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import plots, routing
from bench.harness import (
    IMMEDIATE,
    MODEL,
    Region,
    Sim,
    apply,
    start_agent,
    start_control,
    start_sims,
)
from bench.load import Client, Req, poisson
from meridian.procs import free_port

A, B = "bench", "peer"
MULTIPLES = (1.0, 2.0, 5.0)
RULE = {"name": "bench-out", "region": A, "peers": [B], "triggers": ["overload", "failure"]}


@dataclass
class Options:
    workers: int = 2  # per region
    seconds: float = 20.0
    speed: float = 0.5
    stream_interval: int = 16
    capacity_rps: float | None = None
    out: Path | None = None
    plot: Path | None = None
    root: Path = Path(".")


def fleet_document(a: list[Sim], b: list[Sim], ports: dict[str, int]) -> dict[str, Any]:
    regions = [(A, "local", a), (B, "elsewhere", b)]
    return {
        "apiVersion": "meridian/v1",
        "clouds": [{"name": "local", "provider": "onprem"}],
        "regions": [{"name": r, "cloud": "local", "geography": r, "jurisdiction": j,
                     "gateway_url": f"http://127.0.0.1:{ports[r]}"} for r, j, _ in regions],
        "nodes": [{"name": f"{r}-1", "region": r, "hostname": "127.0.0.1"} for r, _, _ in regions],
        "models": [{"name": MODEL, "source": "meridian/sim", "context_length": 131072,
                    "capabilities": ["chat", "completion"]}],
        "deployments": [{"name": f"{r}-sims", "model": MODEL, "region": r,
                         "backend": "external", "external_urls": [s.url for s in sims]}
                        for r, _, sims in regions],
        "routing_policies": [{"name": A, "model": MODEL, "policy": "cost", "max_queue": 64}],
        "tenants": [{"name": "resident", "tier": "standard", "allowed_jurisdictions": ["local"]}],
        "rollout_policies": IMMEDIATE,
    }  # fmt: skip


async def run(options: Options) -> dict[str, Any]:
    console = Console(width=150)
    o = routing.Options(
        workers=options.workers, phase_seconds=options.seconds, speed=options.speed,
        stream_interval=options.stream_interval, start_rps=4.0, root=options.root,
    )  # fmt: skip
    workload = o.workload()
    result: dict[str, Any] = {"results": {}}
    async with AsyncExitStack() as stack:
        with console.status("starting simulators, a control plane and two regions"):
            sims = await start_sims(
                stack, 2 * o.workers, max_total_tokens=o.pool_tokens,
                stream_interval=o.stream_interval, speeds=[o.speed] * 2 * o.workers,
                log_dir=options.root,
            )  # fmt: skip
            sims_a, sims_b = sims[: o.workers], sims[o.workers :]
            cp, admin = await start_control(stack, options.root)
            ports = {A: free_port(), B: free_port()}
            await apply(admin, fleet_document(sims_a, sims_b, ports))
            operator = secrets.token_urlsafe(24)
            agents = {}
            for name in (A, B):
                agents[name], _ = await start_agent(
                    stack, options.root, cp, admin, name, f"{name}-1", operator, ports[name]
                )
            made = await admin.post("/v1/api-keys", json={"tenant": "resident"})
            made.raise_for_status()
            resident_key = made.json()["key"]
        region = Region(cp, admin, [agents[A]], [f"http://127.0.0.1:{ports[A]}"], operator,
                        o.workers)  # fmt: skip
        client = Client({"Authorization": f"Bearer {operator}"})
        stack.push_async_callback(client.close)
        bench = routing.Bench(o, console, stack, options.root, sims, region, client)
        await bench.use("cost", sims_a)  # A's route; every phase flushes all simulators
        if options.capacity_rps is None:
            console.print("[bold]capacity[/] of region A alone (cost policy, with admission)")
            capacity, _ = await routing._sweep(bench, workload)
        else:
            capacity = options.capacity_rps
        result["capacity_rps"] = round(capacity, 3)

        def keep() -> None:  # each part written as soon as it is measured
            plots.write_json(console, result, options.out)

        keep()

        async def load(multiple: float, seed: int, who: Client = client) -> dict[str, Any]:
            rate = capacity * multiple
            reqs = routing._subset(workload, round(rate * options.seconds), seed=seed)
            bench.client = who
            try:
                s = await bench.phase(reqs, rate, seed=seed)
            finally:
                bench.client = client
            served = s["requests"] - s["failed"]
            s["peer_served"] = s["served_by"].get(B, 0)
            s["peer_share"] = round(s["peer_served"] / served, 4) if served else 0.0
            routing._progress(bench, f"{multiple:.1f}x {rate:6.2f} rps", s)
            return s

        for mode in ("no_escalation", "escalation"):
            await _rule(admin, region, on=mode == "escalation")
            bench.current = mode
            runs = {}
            for multiple in MULTIPLES:
                s = await load(multiple, seed=int(multiple * 10))
                runs[f"{multiple:.0f}x"] = _row(s)
            result["results"][mode] = runs
            keep()
        room = await load(0.5, seed=5)
        result["escalated_share_with_room"] = room["peer_share"]
        keep()
        resident = Client({"Authorization": f"Bearer {resident_key}"})
        stack.push_async_callback(resident.close)
        bench.current = "residency"
        kept = await load(5.0, seed=55, who=resident)
        result["residency_5x"] = {"served_by_peer": kept["peer_served"], **_row(kept)}
        keep()
        bench.current = "engines_die"
        result["engines_die"] = await _failover(bench, workload, capacity * 0.5, sims_a, options)
    _report(console, result)
    plots.save(
        console, result, options.out, options.plot,
        lambda path: plots.modes_by_load(
            result["results"], path, ttft_key="ttft_p99_served_s",
            xlabel="offered load into A, x A's capacity",
        ),
    )  # fmt: skip
    return result


async def _rule(admin: Any, region: Region, on: bool) -> None:
    """A's fallback rule to B, made or removed; once A's agent runs the revision."""
    if on:
        answer = await admin.post("/v1/fallback-rules", json=RULE)
    else:
        answer = await admin.delete(f"/v1/fallback-rules/{RULE['name']}", headers={"If-Match": "*"})
    if answer.status_code not in (200, 201, 204, 404):
        answer.raise_for_status()
    want = int((await admin.get("/v1/revision")).json()["revision"])
    await region._settled(want, kv_events=True)


def _row(s: dict[str, Any]) -> dict[str, Any]:
    return {
        "rate_rps": s["rate_rps"], "goodput_rps": s["goodput_rps"],
        "ttft_p99_served_s": s["ttft_p99_s"], "slo_met": s["slo_met"],
        "refused_share": round(s["rejected"] / max(1, s["requests"]), 4),
        "peer_share": s["peer_share"], "failed": s["failed"],
    }  # fmt: skip


async def _failover(
    bench: routing.Bench, workload: list[Req], rate: float, doomed: list[Sim], options: Options
) -> dict[str, Any]:
    """Traffic at `rate` into A; A's engines are killed a third of the way in."""
    reqs = routing._subset(workload, round(rate * options.seconds), seed=77)
    loop = asyncio.get_running_loop()
    killed_at = 0.0

    async def kill() -> None:
        nonlocal killed_at
        await asyncio.sleep(options.seconds / 3)
        killed_at = loop.time()
        for sim in doomed:
            os.kill(sim.process.pid, signal.SIGKILL)

    killer = asyncio.create_task(kill())
    results, _ = await poisson(bench.client, bench.pick, reqs, rate, seed=77)
    await killer
    after = [r for r in results if r.done > killed_at]
    rescued = [r for r in after if r.status == 200 and r.region == B]
    first_token = min((r.sent_at + r.ttft_s for r in rescued), default=None)
    return {
        "rate_rps": round(rate, 3),
        # the first answer B served after the kill: its first token, and its end
        "first_escalated_token_s": round(first_token - killed_at, 3) if first_token else None,
        "first_escalated_success_s": (
            round(min(r.done for r in rescued) - killed_at, 3) if rescued else None
        ),
        "failed": sum(r.status != 200 for r in results),
        "failed_after_kill": sum(r.status != 200 for r in after),
        "requests": len(results),
        "errors": sorted({r.error[:80] for r in results if r.status != 200})[:5],
    }


def _report(console: Console, result: dict[str, Any]) -> None:
    table = Table(title=f"escalation: region A of capacity {result['capacity_rps']:.2f} rps, "
                        "an idle peer B")  # fmt: skip
    for column in ("mode", "load", "rate rps", "goodput rps", "TTFT p99 served s",
                   "within SLO", "refused 429/503", "served by B", "failed"):  # fmt: skip
        table.add_column(column, justify="right")
    for mode, runs in result["results"].items():
        for load, r in runs.items():
            table.add_row(
                mode, load, f"{r['rate_rps']:.2f}", f"{r['goodput_rps']:.2f}",
                f"{r['ttft_p99_served_s']:.3f}", f"{r['slo_met']:.1%}",
                f"{r['refused_share']:.1%}", f"{r['peer_share']:.1%}", str(r["failed"]),
            )  # fmt: skip
    console.print(table)
    base, esc = result["results"]["no_escalation"]["5x"], result["results"]["escalation"]["5x"]
    ratio = esc["goodput_rps"] / base["goodput_rps"] if base["goodput_rps"] else float("inf")
    console.print(f"goodput at 5x: {ratio:.2f}x the no-escalation baseline (goal >= 2x)")
    console.print(f"escalated with room (0.5x): {result['escalated_share_with_room']:.1%} "
                  "(goal 0)")  # fmt: skip
    console.print(f"residency at 5x: {result['residency_5x']['served_by_peer']} requests served "
                  "by B, outside the tenant's jurisdiction (goal 0)")  # fmt: skip
    die = result["engines_die"]
    console.print(
        f"A's engines killed: B's first token {die['first_escalated_token_s']} s after, its "
        f"first whole answer {die['first_escalated_success_s']} s after; "
        f"{die['failed_after_kill']} requests failed after the kill"
    )
