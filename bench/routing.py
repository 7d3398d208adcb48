"""`meridian bench routing`: routing policies side by side on the same simulated workers.

Workload: SGLang bench_serving's generated-shared-prefix (64 groups x 16 prompts, a 2,048-token
system prompt, a 128-token question, 256 output tokens, shuffled), as OpenAI chat streams.
Each simulated worker's KV pool holds about a quarter of all the prefixes plus its running
requests, so where a request goes decides whether its prefix is still cached.

For each contender it sweeps Poisson arrival rates; its capacity is the highest rate at which
at least 90% of requests meet the SLO (TTFT <= 2 s, mean inter-token gap <= 50 ms). Then every
contender runs the whole workload at 80% of round robin's capacity for the latency figures.
Then, so that a policy is not judged on one workload: a single hot prefix group on 2 workers
(sglang issue #21199's shape), multi-turn chats, and workers of mixed speed.
"""

from __future__ import annotations

import random
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.harness import (
    CpuMeter,
    Region,
    SglangRouter,
    Sim,
    cache_counters,
    flush,
    start_region,
    start_sglang_router,
    start_sims,
)
from bench.load import (
    Client,
    Req,
    conversations,
    play_conversations,
    poisson,
    shared_prefix,
    summarize,
    sweep,
    warm_ttft_p99,
)
from bench.plots import write_json
from meridian.procs import stop_child

# name -> (where it runs, policy, params)
CONTENDERS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "round_robin": ("meridian", "round_robin", {}),
    "cache_aware": ("meridian", "cache_aware", {}),
    "cost": ("meridian", "cost", {"kv_events": True}),
    "cost_answers": ("meridian", "cost", {"kv_events": True, "price_answers": True}),
    "cost_approx": ("meridian", "cost", {}),
    "cost_two_gateways": ("meridian2", "cost", {"kv_events": True}),
    "sglang_router_cache_aware": ("sglang", "cache_aware", {}),
    "sglang_router_round_robin": ("sglang", "round_robin", {}),
}
EXTRA_CONTENDERS = ("round_robin", "cost", "cost_answers", "sglang_router_cache_aware")


@dataclass
class Options:
    workers: int = 8
    groups: int = 64
    per_group: int = 16
    system_tokens: int = 2048
    question_tokens: int = 128
    output_tokens: int = 256
    stream_interval: int = 16
    speed: float = 0.5
    phase_seconds: float = 30.0
    start_rps: float = 8.0
    growth: float = 1.5
    max_phases: int = 12
    ttft_slo_s: float = 2.0
    itl_slo_s: float = 0.05
    contenders: list[str] = field(default_factory=lambda: list(CONTENDERS))
    extra: bool = True
    extra_only_at: float | None = None  # round robin's capacity from an earlier run: no sweeps
    seed: int = 1
    out: Path | None = None
    plot: Path | None = None
    root: Path = Path(".")  # scratch: the PostgreSQL files and the processes' logs

    def workload(self) -> list[Req]:
        """The shared-prefix workload (SGLang bench_serving's generated-shared-prefix)."""
        return shared_prefix(self.groups, self.per_group, self.system_tokens,
                             self.question_tokens, self.output_tokens, self.seed)  # fmt: skip

    @property
    def pool_tokens(self) -> int:
        """A quarter of all the prefixes, plus room for the requests running at once."""
        prefixes = self.groups * self.system_tokens
        running = 16 * (self.system_tokens + self.question_tokens + self.output_tokens) // 2
        return prefixes // 4 + running


@dataclass
class Bench:
    options: Options
    console: Console
    stack: AsyncExitStack
    root: Path
    sims: list[Sim]
    region: Region
    client: Client
    current: str = ""
    url: str = ""
    pids: list[int] = field(default_factory=list)
    router: SglangRouter | None = None

    async def use(self, name: str, sims: list[Sim] | None = None) -> None:
        """Point the load at contender `name`, on `sims` (default: all of them)."""
        where, policy, params = CONTENDERS[name]
        sims = sims or self.sims
        if self.router is not None:
            await stop_child(self.router.process)
            self.router = None
        if where == "sglang":
            self.router = await start_sglang_router(self.stack, policy, sims, self.root)
            self.url, self.pids = self.router.url, [self.router.process.pid]
        else:
            await self._workers(sims)
            slo = {"slo_ttft_ms": int(self.options.ttft_slo_s * 1000),
                   "slo_itl_ms": int(self.options.itl_slo_s * 1000)}  # fmt: skip
            await self.region.route(policy, params, **slo)
            gateways = 2 if where == "meridian2" else 1
            self.url = ""
            self.pids = self.region.pids[:gateways]
        self.current = name

    async def _workers(self, sims: list[Sim]) -> None:
        if self.region.workers == len(sims):
            return
        urls = [s.url for s in sims]
        answer = await self.region.admin.patch(
            "/v1/deployments/sims", json={"external_urls": urls}, headers={"If-Match": "*"}
        )
        answer.raise_for_status()
        self.region.workers = len(sims)

    def pick(self, i: int) -> str:
        if self.url:
            return self.url
        gateways = self.region.gateway_urls[: len(self.pids)]
        return gateways[i % len(gateways)]

    async def phase(
        self,
        reqs: list[Req] | None,
        rate: float,
        seed: int,
        sims: list[Sim] | None = None,
        chats: int = 0,
    ) -> dict[str, Any]:
        """One run at `rate` from cold caches: the summary, hit rate and CPU."""
        sims = sims or self.sims
        await flush(sims)
        before = await cache_counters(sims)
        meter = CpuMeter({"engines": [s.process.pid for s in sims], "router": self.pids})
        meter.begin()
        if reqs is not None:
            results, span = await poisson(self.client, self.pick, reqs, rate, seed)
        else:  # multi-turn: `chats` conversations of 6 turns sharing one system prompt
            chat_list = conversations(chats, 6, 1024, 64, 128, seed)
            results, span = await play_conversations(self.client, self.pick, chat_list, rate, seed)
        cpu = meter.end(span)
        after = await cache_counters(sims)
        prompt, cached = after[0] - before[0], after[1] - before[1]
        summary = summarize(results, span, self.options.ttft_slo_s, self.options.itl_slo_s)
        summary["hit_rate"] = round(cached / prompt, 4) if prompt else 0.0
        if reqs is not None:
            summary["ttft_p99_warm_s"] = warm_ttft_p99(reqs, results)
        summary["rate_rps"] = round(rate, 3)
        summary["served_by"] = dict(Counter(r.region for r in results if r.status == 200))
        summary["cpu"] = cpu
        return summary


async def one_region(
    o: Options, console: Console, stack: AsyncExitStack, gateways: int = 1
) -> Bench:
    """`o.workers` simulators at `o.speed` and a region of `gateways` agents in front of them,
    with the operator's client: the single-region benchmarks' start."""
    with console.status(f"starting {o.workers} simulators and a region of {gateways} gateways"):
        sims = await start_sims(
            stack, o.workers, max_total_tokens=o.pool_tokens,
            stream_interval=o.stream_interval, speeds=[o.speed] * o.workers, log_dir=o.root,
        )  # fmt: skip
        region = await start_region(stack, o.root, sims, gateways=gateways)
    client = Client({"Authorization": f"Bearer {region.operator}"})
    stack.push_async_callback(client.close)
    return Bench(o, console, stack, o.root, sims, region, client)


async def capacity_of(bench: Bench, workload: list[Req], known: float | None) -> float:
    """The region's capacity under the cost policy with admission: `known`, or swept."""
    await bench.use("cost")
    if known is not None:
        return known
    bench.console.print("[bold]capacity[/] of the region (cost policy, with admission)")
    capacity, _ = await _sweep(bench, workload)
    return capacity


def _subset(workload: list[Req], count: int, seed: int) -> list[Req]:
    """`count` requests of the workload, reshuffled; cycling through it if it has fewer."""
    picked = list(workload)
    random.Random(seed).shuffle(picked)
    return [picked[i % len(picked)] for i in range(count)]


async def _sweep(bench: Bench, workload: list[Req]) -> tuple[float, list[dict[str, Any]]]:
    o = bench.options
    phases: list[dict[str, Any]] = []

    async def passes(rate: float, seed: int) -> bool:
        count = max(64, round(rate * o.phase_seconds))
        summary = await bench.phase(_subset(workload, count, seed), rate, seed=seed)
        phases.append(summary)
        _progress(bench, f"{rate:6.2f} rps", summary)
        return bool(summary["slo_met"] >= 0.9)

    capacity = await sweep(o.start_rps, o.growth, o.max_phases, passes)
    return capacity, phases


def _progress(bench: Bench, what: str, s: dict[str, Any]) -> None:
    bench.console.print(
        f"  {bench.current:<26} {what}: slo {s['slo_met']:.0%}, ttft p99 {s['ttft_p99_s']:.2f} s,"
        f" itl p99 {s['itl_p99_s'] * 1000:.0f} ms, hit {s['hit_rate']:.0%}, failed {s['failed']},"
        f" machine {s['cpu']['machine_busy']:.0%}" + (f" {s['statuses']}" if s["statuses"] else "")
    )


async def run(options: Options) -> dict[str, Any]:
    console = Console(width=150)
    o = options
    workload = o.workload()
    result: dict[str, Any] = {"results": {}, "sweeps": {}, "workloads": {}, "setup": {}}
    async with AsyncExitStack() as stack:
        bench = await one_region(o, console, stack, gateways=2)
        result["setup"] = {
            "workers": o.workers, "speed": o.speed, "pool_tokens": o.pool_tokens, "page_size": 16,
            "stream_interval": o.stream_interval, "phase_seconds": o.phase_seconds,
            "slo": {"ttft_s": o.ttft_slo_s, "itl_s": o.itl_slo_s},
        }  # fmt: skip
        base = o.extra_only_at
        if base is None:
            base = await _main_workload(bench, workload, result)
        if o.extra:
            await _extra(bench, base, result)
    _report(console, result)
    if o.plot is not None and result["sweeps"]:
        _plot(result, o.plot)
        console.print(f"wrote {o.plot}")
    return result


async def _main_workload(bench: Bench, workload: list[Req], result: dict[str, Any]) -> float:
    """Each contender's capacity sweep, then each at 80% of round robin's capacity; that
    capacity (the base the other workloads' rates are set from)."""
    o, console = bench.options, bench.console
    capacities: dict[str, float] = {}
    for name in o.contenders:
        console.print(f"[bold]{name}[/]: capacity sweep")
        await bench.use(name)
        capacities[name], result["sweeps"][name] = await _sweep(bench, workload)
        write_json(console, result, o.out)  # each part kept as soon as it is measured
    base = capacities.get("round_robin") or max(capacities.values())
    rate = 0.8 * base
    console.print(f"[bold]latency at {rate:.2f} rps[/] (80% of round robin's capacity)")
    for name in o.contenders:
        await bench.use(name)
        summary = await bench.phase(workload, rate, seed=1000)
        _progress(bench, f"{rate:6.2f} rps", summary)
        result["results"][name] = {
            "capacity_rps": round(capacities[name], 3),
            **{k: summary[k] for k in ("hit_rate", "ttft_p50_s", "ttft_p99_s",
                                       "ttft_p99_warm_s", "itl_p50_s",
                                       "itl_p99_s", "output_tok_per_s", "goodput_rps",
                                       "failed", "slo_met", "cpu")},
        }  # fmt: skip
        write_json(console, result, o.out)
    return base


async def _extra(bench: Bench, base_rps: float, result: dict[str, Any]) -> None:
    """Other workloads at a fixed rate each, for the policies that matter most."""
    o, console = bench.options, bench.console
    out: dict[str, Any] = result["workloads"]
    hot = shared_prefix(1, 256, o.system_tokens, o.question_tokens, o.output_tokens, o.seed + 1)
    two = bench.sims[:2]
    shapes = [
        ("hot_prefix_2_workers", hot, 0.8 * base_rps * 2 / len(bench.sims), two, 0),
        ("multi_turn", None, base_rps / 10, None, 96),
        ("mixed_speed", None, 0.6 * base_rps, None, 0),
    ]
    workload = o.workload()
    for shape, reqs, rate, sims, chats in shapes:
        out[shape] = {"rate_rps": round(rate, 3)}
        slow = bench.sims[len(bench.sims) // 2 :] if shape == "mixed_speed" else []
        await _slow(slow, 2.0)
        try:
            for name in EXTRA_CONTENDERS:
                console.print(f"[bold]{shape}[/]: {name} at {rate:.2f} rps")
                await bench.use(name, sims)
                source = workload if shape == "mixed_speed" else reqs
                summary = await bench.phase(source, rate, seed=2000, sims=sims, chats=chats)
                _progress(bench, f"{rate:6.2f} rps", summary)
                out[shape][name] = summary
                write_json(console, result, o.out)
        finally:
            await _slow(slow, 1.0)
    await bench._workers(bench.sims)


async def _slow(sims: list[Sim], factor: float) -> None:
    """Half of the workers at half speed: the simulator's slow factor, set while it runs."""
    async with httpx.AsyncClient(timeout=5) as http:
        for sim in sims:
            (
                await http.post(f"{sim.url}/sim/faults", json={"slow_factor": factor})
            ).raise_for_status()


def _report(console: Console, result: dict[str, Any]) -> None:
    table = Table(title="routing: capacity (90% within SLO) and latency at 80% of round robin's")
    columns = ("contender", "capacity rps", "hit rate", "TTFT p50 s", "TTFT p99 s",
               "warm TTFT p99 s", "ITL p50 ms", "ITL p99 ms", "out tok/s", "goodput rps", "failed",
               "router CPU cores", "machine busy")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for name, r in result["results"].items():
        table.add_row(
            name, f"{r['capacity_rps']:.2f}", f"{r['hit_rate']:.1%}", f"{r['ttft_p50_s']:.3f}",
            f"{r['ttft_p99_s']:.3f}", f"{r['ttft_p99_warm_s']:.3f}",
            f"{r['itl_p50_s'] * 1000:.1f}",
            f"{r['itl_p99_s'] * 1000:.1f}", f"{r['output_tok_per_s']:.0f}",
            f"{r['goodput_rps']:.2f}", str(r["failed"]), f"{r['cpu']['router']:.2f}",
            f"{r['cpu']['machine_busy']:.0%}",
        )  # fmt: skip
    console.print(table)
    for shape, runs in result.get("workloads", {}).items():
        table = Table(title=f"{shape} at {runs['rate_rps']:.2f} rps")
        for column in ("contender", "SLO met", "hit rate", "TTFT p50 s", "TTFT p99 s",
                       "ITL p99 ms", "failed"):  # fmt: skip
            table.add_column(column, justify="right")
        for name, s in runs.items():
            if name == "rate_rps":
                continue
            table.add_row(
                name, f"{s['slo_met']:.1%}", f"{s['hit_rate']:.1%}", f"{s['ttft_p50_s']:.3f}",
                f"{s['ttft_p99_s']:.3f}", f"{s['itl_p99_s'] * 1000:.1f}", str(s["failed"]),
            )  # fmt: skip
        console.print(table)


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    for name, phases in result["sweeps"].items():
        ordered = sorted(phases, key=lambda p: p["rate_rps"])
        left.plot([p["rate_rps"] for p in ordered], [p["slo_met"] for p in ordered],
                  marker="o", label=name)  # fmt: skip
    left.axhline(0.9, color="grey", linestyle="--", linewidth=1)
    left.set_xlabel("arrival rate, requests/s")
    left.set_ylabel("share of requests within SLO")
    left.set_title("capacity sweep (shared prefix, 8 workers)")
    left.legend(fontsize=8)
    names = list(result["results"])
    p99 = [result["results"][n]["ttft_p99_s"] for n in names]
    right.barh(names, p99)
    right.set_xlabel("TTFT p99, s (at 80% of round robin's capacity)")
    right.set_title("tail latency")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
