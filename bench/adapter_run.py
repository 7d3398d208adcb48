"""`meridian bench adapters`, run: the contenders one after the other (bench/adapters.py says
what each is and what is measured), and the table."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
from contextlib import AsyncExitStack
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench import plots
from bench.adapters import (
    OTHER,
    TENANT,
    A,
    B,
    LoraSim,
    Options,
    adapter_name,
    fleet_document,
    loads,
    phase,
    reset,
    start_lora_sims,
    stripe,
    summary,
    workload,
    write_adapters,
)
from bench.harness import MODEL, apply, start_agent, start_control, start_sglang_router
from bench.load import Client, Req
from meridian import procs
from meridian.procs import free_port, stop_child, wait_ready

PEERS = ("round_robin", "cache_aware")


async def run(o: Options) -> dict[str, Any]:
    console = Console(width=150)
    result: dict[str, Any] = {"options": {k: str(v) for k, v in vars(o).items()},
                              "contenders": {}}  # fmt: skip
    reqs = {A: workload(o, 1), B: workload(o, 2)}
    async with AsyncExitStack() as stack, httpx.AsyncClient(timeout=60) as http:
        paths = write_adapters(console, o.root / "adapters", o.adapters)
        with console.status(f"starting {2 * o.engines} simulated engines with LoRA"):
            sims = await start_lora_sims(stack, o, paths, 2 * o.engines)
        regions = {A: sims[: o.engines], B: sims[o.engines :]}
        for policy in (p for p in PEERS if p in o.contenders):
            with console.status(f"{policy}: engines loading their quarter of the adapters"):
                await reset(http, sims)
                for mine in regions.values():
                    await stripe(http, mine, paths)
            async with AsyncExitStack() as routers:
                urls = {}
                for r, mine in regions.items():
                    router = await start_sglang_router(routers, policy, [s.sim for s in mine],
                                                       o.root)  # fmt: skip
                    urls[r] = router.url
                client = Client()
                routers.push_async_callback(client.close)
                before = await loads(http, sims)
                with console.status(f"{policy}: {o.seconds:.0f} s of traffic"):
                    results = await phase(client, urls, reqs, o.rate, seed=10)
                row = summary(results, reqs[A] + reqs[B], await loads(http, sims) - before)
            result["contenders"][policy] = row
            console.print(f"{policy}: {row}")
            plots.write_json(console, result, o.out)
        await reset(http, sims)
        if "meridian" not in o.contenders:
            _report(console, result)
            return result
        meridian = await _meridian(stack, o, http, sims, regions, paths, reqs, result, console)
        result["contenders"]["meridian"] = meridian
    _report(console, result)
    plots.write_json(console, result, o.out)
    return result


async def _meridian(
    stack: AsyncExitStack, o: Options, http: httpx.AsyncClient, sims: list[LoraSim],
    regions: dict[str, list[LoraSim]], paths: dict[str, Any], reqs: dict[str, list[Req]],
    result: dict[str, Any], console: Console,
) -> dict[str, Any]:  # fmt: skip
    cp, admin = await start_control(stack, o.root, {"MERIDIAN_ADAPTER_RESIDENCY_S": "2"})
    ports = {A: free_port(), B: free_port()}
    urls = {r: [s.sim.url for s in mine] for r, mine in regions.items()}
    loop = asyncio.get_running_loop()
    await apply(admin, fleet_document(o, urls, ports, {}))  # the fleet, serving, no adapters
    operator = secrets.token_urlsafe(24)
    for r in (A, B):
        await start_agent(stack, o.root, cp, admin, r, f"{r}-1", operator, ports[r])
    gateways = {r: f"http://127.0.0.1:{p}" for r, p in ports.items()}
    status = _Status(http, gateways, operator)
    with console.status("meridian: the agents reading their engines"):
        await status.until_polled(o.engines, 120)
    registered = loop.time()
    await apply(admin, fleet_document(o, urls, ports, paths))
    applied = loop.time()
    with console.status("meridian: the leader's residency plan, loaded"):
        marks = await status.until_resident(600)
    reached = {k: round(t - registered, 1) for k, t in (marks | {"applied": applied}).items()}
    reached_s = reached["held"]
    console.print(f"meridian: after registration (its apply answered in {reached['applied']} s), "
                  f"the agents knew the adapters in "
                  f"{reached['known']} s, had the leader's plan in {reached['planned']} s, and "
                  f"held it in {reached_s} s")  # fmt: skip
    keys = {}
    for tenant in (TENANT, OTHER):
        made = await admin.post("/v1/api-keys", json={"tenant": tenant})
        made.raise_for_status()
        keys[tenant] = made.json()["key"]
    await asyncio.sleep(6)  # every agent knows the keys
    client = Client({"Authorization": f"Bearer {keys[TENANT]}"})
    stack.push_async_callback(client.close)
    before, cold_before = await loads(http, sims), await status.cold_loads()
    with console.status(f"meridian: {o.seconds:.0f} s of traffic"):
        results = await phase(client, gateways, reqs, o.rate, seed=10)
    row = summary(results, reqs[A] + reqs[B], await loads(http, sims) - before)
    row["cold_loads"] = await status.cold_loads() - cold_before
    row["stall_share"] = round(row["cold_loads"] / max(1, row["adapter_requests"]), 4)
    row["residency_reached_s"] = reached_s
    row["residency_steps_s"] = reached
    result["contenders"]["meridian"] = row
    plots.write_json(console, result, o.out)
    with console.status("meridian: an engine killed and started again under traffic"):
        row["engine_kill"] = await _kill(o, client, gateways, reqs, regions[A][0], status, stack)
    row["other_tenant"] = await _other(keys[OTHER], gateways, o)
    return row


class _Status:
    def __init__(self, http: httpx.AsyncClient, gateways: dict[str, str], operator: str) -> None:
        self.http, self.gateways = http, gateways
        self.headers = {"Authorization": f"Bearer {operator}"}

    async def adapters(self, region: str) -> dict[str, Any]:
        url = f"{self.gateways[region]}/agent/status"
        found: dict[str, Any] = (await self.http.get(url, headers=self.headers)).json()["adapters"]
        return found

    async def until_polled(self, engines: int, within_s: float) -> None:
        """Each agent has read the load of each of its `engines` engines."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        headers = self.headers
        while True:
            polled = []
            for gateway in self.gateways.values():
                found = (await self.http.get(f"{gateway}/agent/status", headers=headers)).json()
                workers = found["router"]["workers"].values()
                polled.append(sum(w["engine"] is not None for w in workers))
            if min(polled) >= engines:
                return
            if loop.time() > deadline:
                raise RuntimeError(f"the agents read {polled} engines, not {engines} each")
            await asyncio.sleep(0.2)

    async def resident(self, marks: dict[str, float]) -> bool:
        """Every adapter held where the plan puts it, and some planned at all. `marks`: when
        every agent first knew the adapters, and first had a plan for them."""
        planned = known = 0
        held = True
        now = asyncio.get_running_loop().time()
        for r in self.gateways:
            adapters = await self.adapters(r)
            known += bool(adapters)
            for a in adapters.values():
                want = a["planned"]
                planned += len(want)
                held = held and set(want) <= set(a["engines"])
        if known == len(self.gateways):
            marks.setdefault("known", now)
        if planned:
            marks.setdefault("planned", now)
        return held and planned > 0

    async def until_resident(self, within_s: float) -> dict[str, float]:
        """When the agents knew the adapters, had a plan, and held it (loop time)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        marks: dict[str, float] = {}
        while not await self.resident(marks):
            if loop.time() > deadline:
                raise RuntimeError("the residency plan was not loaded in time")
            await asyncio.sleep(0.2)
        marks["held"] = loop.time()
        return marks

    async def cold_loads(self) -> int:
        total = 0
        for r in self.gateways:
            total += sum(int(a["cold_loads"]) for a in (await self.adapters(r)).values())
        return total


async def _kill(
    o: Options, client: Client, gateways: dict[str, str], reqs: dict[str, list[Req]],
    doomed: LoraSim, status: _Status, stack: AsyncExitStack,
) -> dict[str, Any]:  # fmt: skip
    """The workload again; a third of the way in, `doomed` is killed and started again on its
    port. How long after its restart until it holds what the plan and its past put on it."""
    loop = asyncio.get_running_loop()
    engine = f"{A}-sims/external-0"  # the doomed one: the first engine of A's deployment
    timing: dict[str, float] = {}

    async def kill_and_restart() -> None:
        await asyncio.sleep(o.seconds / 3)
        os.kill(doomed.sim.process.pid, signal.SIGKILL)
        await doomed.sim.process.wait()
        log = o.root / "sim-restarted.log"
        child = await procs.start_sim(doomed.args, port=doomed.port, log=log, ready_timeout_s=None)
        stack.push_async_callback(stop_child, child.process)
        await wait_ready(child.url, child.process, 60, path="/ready", what="a simulator")
        timing["ready"] = loop.time()
        asked = {n for n, a in (await status.adapters(A)).items() if a["requests"]}

        async def missing(only: set[str] | None) -> set[str]:
            """What the plan puts on the engine now (of `only`) that it does not hold, by
            its own word."""
            adapters = await status.adapters(A)
            want = {n for n, a in adapters.items() if engine in a["planned"]}
            loaded = (await http.get(f"{child.url}/sim/lora")).json()["loaded"]
            return (want if only is None else want & only) - set(loaded)

        async with httpx.AsyncClient(timeout=10) as http:
            for only, mark in ((asked, "asked_restored"), (None, "restored")):
                while left := await missing(only):
                    if loop.time() - timing["ready"] > 120:
                        raise RuntimeError(f"{engine} did not get {sorted(left)[:5]} back")
                    await asyncio.sleep(0.1)
                timing[mark] = loop.time()
            adapters = await status.adapters(A)
            timing["asked"] = sum(engine in adapters[n]["planned"] for n in asked)

    killing = asyncio.ensure_future(kill_and_restart())
    results = await phase(client, gateways, reqs, o.rate, seed=20)
    await killing
    return {
        "restored_s_after_ready": round(timing["restored"] - timing["ready"], 2),
        "asked_restored_s_after_ready": round(timing["asked_restored"] - timing["ready"], 2),
        "asked_adapters": int(timing["asked"]),
        "failed": sum(r.status != 200 for r in results),
        "not_loaded_400": sum(r.status == 400 for r in results),
        "requests": len(results),
    }


async def _other(key: str, gateways: dict[str, str], o: Options) -> dict[str, int]:
    """Another tenant asks for acme's adapters: none may serve it."""
    served = refused = 0
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {key}"}) as http:
        for i in range(50):
            model = f"{MODEL}:{adapter_name(i % o.adapters)}" if i % 2 else adapter_name(i)
            body = {"model": model, "max_tokens": 4,
                    "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
            answer = await http.post(f"{gateways[(A, B)[i % 2]]}/v1/chat/completions", json=body)
            served += answer.status_code == 200
            refused += answer.status_code == 404
    return {"asked": 50, "served": served, "refused_404": refused}


def _report(console: Console, result: dict[str, Any]) -> None:
    table = Table(title="LoRA adapters: 2 regions, Zipf demand (TTFT in ms)")
    for column in ("contender", "adapter p50", "adapter p99", "base p50", "base p99",
                   "p99 ratio", "stalls", "failed"):  # fmt: skip
        table.add_column(column, justify="right")
    for name, row in result["contenders"].items():
        table.add_row(
            name, *(f"{1000 * row[k]:.0f}" for k in ("adapter_ttft_p50_s", "adapter_ttft_p99_s",
                                                       "base_ttft_p50_s", "base_ttft_p99_s")),
            f"{row['p99_ratio']}", f"{100 * row['stall_share']:.1f}%", str(row["failed"]),
        )  # fmt: skip
    console.print(table)
    m = result["contenders"].get("meridian")
    if m:
        kill = m.get("engine_kill", {})
        back = kill.get("restored_s_after_ready")
        asked = kill.get("asked_restored_s_after_ready")
        console.print(
            f"meridian: residency reached {m['residency_reached_s']} s after registration; "
            f"an engine killed and restarted: the {kill.get('asked_adapters')} of its adapters "
            f"asked for so far back {asked} s after it was ready, all {back} s after; "
            f"{kill.get('failed')} failed ({kill.get('not_loaded_400')} "
            f"'not loaded'); another tenant served {m.get('other_tenant', {}).get('served')} of "
            f"{m.get('other_tenant', {}).get('asked')} asks for acme's adapters"
        )
