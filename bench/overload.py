"""`meridian bench overload`: one region at 1x, 2x and 5x its capacity, with admission control
and without.

The region's capacity is measured first (the `cost` policy, the routing benchmark's sweep).
With admission, the route has the benchmark's SLO (TTFT 2 s, inter-token gap 50 ms) and a
bounded queue: a request waits only while a worker can still start it within the SLO, and is
answered 429 otherwise. Without, the route has no SLO, an unbounded queue and no vetoes:
every request goes to an engine at once. For each: goodput (requests a second that met the
SLO), TTFT p99 of the requests that were served, and the share answered 429 or 503.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import plots, routing

MULTIPLES = (1.0, 2.0, 5.0)
# KV events on: the engines' caches are flushed before each run, and only the exact index
# hears it (an approximate one would send each run after stale prefixes)
MODES: dict[str, tuple[dict[str, Any], dict[str, int | None]]] = {
    "admission": ({"kv_events": True}, {"slo_ttft_ms": 2000, "slo_itl_ms": 50, "max_queue": 64}),
    "no_admission": (
        {"kv_events": True, "max_waiting": 1_000_000, "max_kv_usage": 1.0},
        {"slo_ttft_ms": None, "slo_itl_ms": None, "max_queue": 1_000_000},
    ),
}


@dataclass
class Options:
    workers: int = 4
    seconds: float = 20.0
    speed: float = 0.5
    stream_interval: int = 16
    capacity_rps: float | None = None  # from an earlier run: no sweep
    modes: tuple[str, ...] = tuple(MODES)
    out: Path | None = None
    plot: Path | None = None
    root: Path = Path(".")


async def run(options: Options) -> dict[str, Any]:
    console = Console(width=150)
    o = routing.Options(
        workers=options.workers, phase_seconds=options.seconds, speed=options.speed,
        stream_interval=options.stream_interval, start_rps=8.0, root=options.root,
    )  # fmt: skip
    workload = o.workload()
    result: dict[str, Any] = {"results": {}}
    async with AsyncExitStack() as stack:
        bench = await routing.one_region(o, console, stack)
        region = bench.region
        capacity = await routing.capacity_of(bench, workload, options.capacity_rps)
        result["capacity_rps"] = round(capacity, 3)
        plots.write_json(console, result, options.out)  # each part kept as it is measured
        for mode in options.modes:
            params, route = MODES[mode]
            await region.route("cost", params, **route)
            bench.current = mode
            runs = {}
            for multiple in MULTIPLES:
                rate = capacity * multiple
                count = round(rate * options.seconds)
                reqs = routing._subset(workload, count, seed=int(multiple * 10))
                s = await bench.phase(reqs, rate, seed=int(multiple * 10))
                routing._progress(bench, f"{multiple:.0f}x {rate:6.2f} rps", s)
                served = s["requests"] - s["failed"]
                runs[f"{multiple:.0f}x"] = {
                    "rate_rps": s["rate_rps"], "goodput_rps": s["goodput_rps"],
                    "ttft_p99_admitted_s": s["ttft_p99_s"], "itl_p99_s": s["itl_p99_s"],
                    "rejected_share": round(s["rejected"] / max(1, s["requests"]), 4),
                    "served": served, "slo_met_of_served": round(
                        s["slo_met"] * s["requests"] / max(1, served), 4),
                    "other_failures": s["failed"] - s["rejected"],
                }  # fmt: skip
            result["results"][mode] = runs
            plots.write_json(console, result, options.out)
    _report(console, result)
    plots.save(
        console, result, options.out, options.plot,
        lambda path: plots.modes_by_load(
            result["results"], path, ttft_key="ttft_p99_admitted_s",
            xlabel="offered load, x capacity", log_ttft=True,
        ),
    )  # fmt: skip
    return result


def _report(console: Console, result: dict[str, Any]) -> None:
    table = Table(title=f"overload: a region of capacity {result['capacity_rps']:.2f} rps")
    for column in ("mode", "load", "rate rps", "goodput rps", "TTFT p99 of served s",
                   "served within SLO", "answered 429/503", "other failures"):  # fmt: skip
        table.add_column(column, justify="right")
    for mode, runs in result["results"].items():
        for load, r in runs.items():
            table.add_row(
                mode, load, f"{r['rate_rps']:.2f}", f"{r['goodput_rps']:.2f}",
                f"{r['ttft_p99_admitted_s']:.3f}", f"{r['slo_met_of_served']:.1%}",
                f"{r['rejected_share']:.1%}", str(r["other_failures"]),
            )  # fmt: skip
    console.print(table)
