"""`meridian bench quotas`: a tenant's global quota under traffic that moves, with leases that
follow demand against the static shares, side by side in one run.

Per mode (`static`: MERIDIAN_QUOTA_LEASES=false, every agent keeps its share by GPUs;
`leases`), a control plane on an embedded PostgreSQL and three regions of equal capacity,
`east` with two agents, `west` and `eu` with one, all real processes, on one null engine
(`bench/null_engine.py`) so that only the gateways' admission is measured. One tenant of
`--quota` requests a minute; the client offers twice that, at a steady rate, in phases of
`--phase` seconds:

1. everything into `east` (both agents);
2. everything into `eu` (the traffic moved);
3. an even split over the three regions;
4. everything into `west`, and the control plane killed (-9) as the phase begins.

From each second's admissions (HTTP 200) per region, for each phase:
- **over**: the most the fleet admitted in any 60 s window within the phase, above the
  quota, as a share of it (goal ≤ 5%);
- **under**: what the fleet admitted short of the quota over the minute after the
  adaptation time (goal ≤ 5%; the outage's is what the static shares allow once the leases
  expire);
- **adapted in**: from the phase's start until the fleet's admissions over the last 5 s
  reach 95% of the quota's rate (goal ≤ 10 s).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.harness import MODEL, apply, start_agent, start_control, start_null_engine
from bench.plots import write_json

REGIONS = ("east", "west", "eu")
AGENTS = {"east-1": "east", "east-2": "east", "west-1": "west", "eu-1": "eu"}
GOALS = {"over": 0.05, "under": 0.05, "adapted_s": 10.0}
ADAPT_S = 10.0
PHASES = (
    ("one region (east, 2 agents)", {"east": 1.0}, False),
    ("moved to eu", {"eu": 1.0}, False),
    ("even over three", {"east": 1 / 3, "west": 1 / 3, "eu": 1 / 3}, False),
    ("control plane down (into west)", {"west": 1.0}, True),
)


@dataclass
class Options:
    quota: int = 600
    phase_s: float = 75.0
    out: Path | None = None
    plot: Path | None = None
    root: Path = Path(".")


def fleet_document(engine: str, quota: int) -> dict[str, Any]:
    """Three regions of equal weight (a GPU and an endpoint each), us of one tenant."""
    return {
        "apiVersion": "meridian/v1",
        "clouds": [{"name": "local", "provider": "onprem"}],
        "regions": [{"name": r, "cloud": "local", "geography": r, "jurisdiction": "local"}
                    for r in REGIONS],
        "nodes": [{"name": n, "region": r, "hostname": "127.0.0.1",
                   "gpus": [{"index": 0, "model": "H100", "memory_gb": 80}] if n != "east-2"
                   else []} for n, r in AGENTS.items()],
        "models": [{"name": MODEL, "source": "meridian/sim", "context_length": 131072,
                    "capabilities": ["chat", "completion"]}],
        "deployments": [{"name": f"null-{r}", "model": MODEL, "region": r,
                         "backend": "external", "external_urls": [engine]} for r in REGIONS],
        "routing_policies": [{"name": "default", "model": MODEL, "policy": "round_robin"}],
        "tenants": [{"name": "bench", "tier": "standard", "requests_per_minute": quota}],
        "rollout_policies": [{"name": "default", "strategy": "immediate"}],
    }  # fmt: skip


async def run(options: Options) -> dict[str, Any]:
    console = Console(width=130)
    result: dict[str, Any] = {"options": {"quota": options.quota, "phase_s": options.phase_s},
                              "goals": GOALS, "modes": {}}  # fmt: skip
    async with AsyncExitStack() as stack:
        url = (await start_null_engine(stack, options.root)).url
        for mode, leases in (("static", False), ("leases", True)):
            root = options.root / mode
            root.mkdir()
            result["modes"][mode] = await _mode(console, root, url, leases, options)
            write_json(console, result, options.out)  # each part kept as it is measured
    _report(console, result)
    write_json(console, result, options.out)
    if options.plot is not None:
        _plot(result, options.plot)
        console.print(f"wrote {options.plot}")
    return result


async def _mode(
    console: Console, root: Path, engine: str, leases: bool, options: Options
) -> dict[str, Any]:
    env = {"MERIDIAN_QUOTA_LEASES": str(leases).lower()}
    async with AsyncExitStack() as stack:
        with console.status(f"{'leases' if leases else 'static'}: starting the fleet"):
            cp, admin = await start_control(stack, root, env)
            await apply(admin, fleet_document(engine, options.quota))
            operator = secrets.token_urlsafe(24)
            urls: dict[str, list[str]] = {r: [] for r in REGIONS}
            for node, region in AGENTS.items():
                _, url = await start_agent(stack, root, cp, admin, region, node, operator,
                                           env={"MERIDIAN_AGENT_HEARTBEAT_S": "1"})  # fmt: skip
                urls[region].append(url)
            key = (await admin.post("/v1/api-keys", json={"tenant": "bench"})).json()["key"]
            await _serving(urls, key)
        counts: Counter[tuple[int, str]] = Counter()  # (second since start, region): admitted
        start = time.monotonic()
        phases = []
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=400)) as http:
            for name, split, outage in PHASES:
                with console.status(f"{'leases' if leases else 'static'}: {name}"):
                    began = time.monotonic() - start
                    if outage:
                        cp.process.kill()
                        await cp.process.wait()
                    rates = {r: 2 * options.quota / 60 * share for r, share in split.items()}
                    await _offer(http, urls, key, rates, options.phase_s, counts, start)
                    phases.append(_judge(name, counts, began, options))
    per_second = [{"t": t, "region": r, "admitted": n} for (t, r), n in sorted(counts.items())]
    return {"phases": phases, "per_second": per_second}


async def _serving(urls: dict[str, list[str]], key: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    auth = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=10) as http:
        for url in (u for us in urls.values() for u in us):
            for _ in range(300):
                try:
                    answer = await http.post(f"{url}/v1/chat/completions", json=body, headers=auth)
                    if answer.status_code in (200, 429):
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.2)
            else:
                raise RuntimeError(f"{url} does not serve")
    await asyncio.sleep(5)  # the leader's first leases, and every agent's report


async def _offer(
    http: httpx.AsyncClient, urls: dict[str, list[str]], key: str, rates: dict[str, float],
    seconds: float, counts: Counter[tuple[int, str]], start: float,
) -> None:  # fmt: skip
    """Requests at a steady rate per region, spread over its agents, for `seconds`."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    headers = {"Authorization": f"Bearer {key}"}

    async def one(region: str, url: str) -> None:
        try:
            answer = await http.post(f"{url}/v1/chat/completions", json=body, headers=headers)
        except httpx.HTTPError:
            return
        if answer.status_code == 200:
            counts[int(time.monotonic() - start), region] += 1

    async def region_load(region: str, rate: float) -> None:
        began, n, tasks = time.monotonic(), 0, []
        while (due := began + n / rate) < began + seconds:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            agents = urls[region]
            tasks.append(asyncio.create_task(one(region, agents[n % len(agents)])))
            n += 1
        await asyncio.gather(*tasks)

    await asyncio.gather(*(region_load(r, rate) for r, rate in rates.items()))


def _judge(
    name: str, counts: Counter[tuple[int, str]], began: float, options: Options
) -> dict[str, Any]:
    first, last = int(began) + 1, int(began + options.phase_s) - 1
    fleet = [sum(counts[t, r] for r in REGIONS) for t in range(first, last)]
    per_s = options.quota / 60
    minute = min(60, len(fleet))
    windows = [sum(fleet[i : i + minute]) for i in range(len(fleet) - minute + 1)]
    over = max(windows) * 60 / minute / options.quota - 1 if windows else 0.0
    settled = fleet[int(ADAPT_S) : int(ADAPT_S) + 60]
    under = 1 - sum(settled) / (per_s * len(settled)) if settled else 0.0
    adapted = next((i + 5 for i in range(len(fleet) - 4)
                    if sum(fleet[i : i + 5]) >= 0.95 * 5 * per_s), None)  # fmt: skip
    regions = {r: round(sum(counts[t, r] for t in range(first, last)) * 60 / (last - first), 1)
               for r in REGIONS}  # fmt: skip
    return {"phase": name, "over": round(max(0.0, over), 4), "under": round(max(0.0, under), 4),
            "adapted_s": adapted, "admitted_per_minute": regions}  # fmt: skip


def _report(console: Console, result: dict[str, Any]) -> None:
    table = Table(title=f"a quota of {result['options']['quota']} requests a minute, offered "
                  "twice that; over and under as a share of the quota")  # fmt: skip
    for column in ("phase", "mode", "over (any minute)", "under (adapted)", "adapted in",
                   "admitted per minute by region"):  # fmt: skip
        table.add_column(column)
    modes = result["modes"]
    for i, (name, _, _) in enumerate(PHASES):
        for mode, doc in modes.items():
            p = doc["phases"][i]
            adapted = f"{p['adapted_s']} s" if p["adapted_s"] is not None else "never"
            by_region = ", ".join(f"{r} {v:g}" for r, v in p["admitted_per_minute"].items())
            table.add_row(name, mode, f"{p['over']:.1%}", f"{p['under']:.1%}", adapted, by_region)
    console.print(table)
    console.print(
        f"goals: over ≤ {GOALS['over']:.0%} in every minute, under ≤ {GOALS['under']:.0%} "
        f"once adapted, adapted within {GOALS['adapted_s']:g} s"
    )


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    quota = result["options"]["quota"]
    modes = result["modes"]
    figure, axes = plt.subplots(len(modes), 1, figsize=(12, 4 * len(modes)), sharex=True)
    for ax, (mode, doc) in zip(axes, modes.items(), strict=True):
        seconds = max(p["t"] for p in doc["per_second"]) + 1
        series = {r: [0] * seconds for r in REGIONS}
        for p in doc["per_second"]:
            series[p["region"]][p["t"]] += p["admitted"]
        total = [sum(series[r][t] for r in REGIONS) for t in range(seconds)]
        for label, values in (*series.items(), ("fleet", total)):
            smooth = [sum(values[max(0, t - 4) : t + 1]) * 60 / min(5, t + 1)
                      for t in range(seconds)]  # fmt: skip
            ax.plot(smooth, label=label, linewidth=2 if label == "fleet" else 1)
        ax.axhline(quota, color="black", linestyle="--", label="quota")
        edge = 0.0
        for _ in PHASES[:-1]:
            edge += result["options"]["phase_s"]
            ax.axvline(edge, color="grey", linestyle=":")
        ax.set_title(f"{mode}: admitted per minute (5 s average), by region")
        ax.set_ylabel("requests / minute")
        ax.legend(loc="upper right")
    axes[-1].set_xlabel("seconds (phases: one region, moved, even, control plane down)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
