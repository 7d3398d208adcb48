"""`meridian bench classes`: interactive traffic beside a batch flood, on one region of
simulated engines, with service classes and without.

The region's capacity is measured first (the overload benchmark's sweep: the highest Poisson
rate at which 90% of requests meet the SLO, TTFT 2 s and inter-token gap 50 ms). Then, for
`seconds` each, in one run:

- `alone`: interactive traffic at 70% of capacity, nothing else: its TTFT p99 is the
  reference;
- `classes`: the same, plus batch traffic offered at 3x capacity, as the `batch` class
  (Meridian's defaults but a 5 s bound, so that what is refused is refused soon, as the batch
  runner's lines would be sent again);
- `one_class`: the same traffic with no class at all: every request `standard` (Meridian
  before service classes);
- `strict`: strict priority without reservation: batch may wait on the SLO as interactive
  does (slack 1), with no interactive reserve and weights 1000 to 0.001.

The batch tenant's requests ask for `interactive` (a header above its ceiling, `batch`): an
answer served above it is counted. Goals: interactive TTFT p99 within 1.1x `alone`'s;
batch gets at least 90% of the capacity left (output tokens a second); no admitted batch
request waits past its bound; none served above its ceiling.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from meridian_pb.fleet.v1.classes import ServiceClass
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from agents.engines.contract import engine_priority
from agents.engines.metrics import quantile as quantile_of
from bench import plots, routing
from bench.harness import Sim, flush
from bench.load import Client, Req, Result, poisson, quantile, summarize

INTERACTIVE_LOAD, BATCH_LOAD = 0.7, 3.0  # of capacity
BATCH_WAIT_S = 5.0
SLO = {"slo_ttft_ms": 2000, "slo_itl_ms": 50, "max_queue": 1024}
MODES: dict[str, dict[str, Any] | None] = {  # the route's classes; None: no batch traffic
    "alone": None,
    "classes": {"batch": {"max_wait_s": BATCH_WAIT_S}},
    # the defaults, but batch never gives way once sent
    "no_requeue": {"batch": {"max_wait_s": BATCH_WAIT_S, "requeue": False}},
    # the defaults, but half of each engine kept for interactive while it has traffic
    "reserve_half": {"interactive": {"reserve": 0.5}, "batch": {"max_wait_s": BATCH_WAIT_S}},
    "one_class": {"batch": {"max_wait_s": BATCH_WAIT_S}},  # the load names no class
    "strict": {
        "interactive": {"weight": 1000, "reserve": 0},
        "batch": {"weight": 0.001, "slack": 1.0, "max_wait_s": BATCH_WAIT_S},
    },
}


@dataclass
class Options:
    workers: int = 4
    seconds: float = 60.0
    speed: float = 0.5
    stream_interval: int = 16
    capacity_rps: float | None = None  # from an earlier run: no sweep
    batch_load: float = BATCH_LOAD  # batch offered, as a multiple of capacity
    modes: tuple[str, ...] = tuple(MODES)
    out: Path | None = None
    root: Path = Path(".")


async def run(options: Options) -> dict[str, Any]:
    console = Console(width=160)
    o = routing.Options(
        workers=options.workers, phase_seconds=30.0, speed=options.speed,
        stream_interval=options.stream_interval, start_rps=8.0, root=options.root,
    )  # fmt: skip
    workload = o.workload()
    result: dict[str, Any] = {
        "seconds": options.seconds,
        "batch_load": options.batch_load,
        "results": {},
    }
    async with AsyncExitStack() as stack:
        bench = await routing.one_region(o, console, stack)
        sims, region = bench.sims, bench.region
        capacity = await routing.capacity_of(bench, workload, options.capacity_rps)
        result["capacity_rps"] = round(capacity, 3)
        result["capacity_tok_s"] = round(capacity * o.output_tokens, 1)
        chat = await region.tenant_key("chat", default_class="interactive",
                                        class_ceiling="interactive")  # fmt: skip
        nightly = await region.tenant_key("nightly", default_class="batch", class_ceiling="batch")
        keys = {"chat": chat, "nightly": nightly}
        for mode in options.modes:
            classes = MODES[mode]
            await region.route("cost", {"kv_events": True}, classes=classes, **SLO)
            await flush(sims)
            runs = await _phase(stack, region.gateway_urls[0], region.operator, sims, keys,
                                workload, capacity, options.seconds, mode,
                                options.batch_load)  # fmt: skip
            result["results"][mode] = runs
            _progress(console, mode, runs)
            plots.write_json(console, result, options.out)
    _verdicts(result)
    _report(console, result)
    plots.write_json(console, result, options.out)
    return result


async def _phase(
    stack: AsyncExitStack,
    url: str,
    operator: str,
    sims: list[Sim],
    keys: dict[str, str],
    workload: list[Req],
    capacity: float,
    seconds: float,
    mode: str,
    batch_load: float = BATCH_LOAD,
) -> dict[str, Any]:
    """Interactive at 70% of capacity and (but alone) batch at `batch_load` (3x), side by
    side."""
    named = mode != "one_class"
    chat = Client({"Authorization": f"Bearer {keys['chat']}",
                   **({"x-meridian-class": "interactive"} if named else {})})  # fmt: skip
    # batch work asks for whole answers, as the Batch API's lines are sent
    nightly = Client({"Authorization": f"Bearer {keys['nightly']}",
                      **({"x-meridian-class": "interactive"} if named else {})},
                     stream=False)  # fmt: skip
    stack.push_async_callback(chat.close)
    stack.push_async_callback(nightly.close)
    rate_i, rate_b = capacity * INTERACTIVE_LOAD, capacity * batch_load
    asks_i = routing._subset(workload, round(rate_i * seconds), seed=1)
    asks_b = routing._subset(workload, round(rate_b * seconds), seed=2)
    interactive = poisson(chat, lambda _: url, asks_i, rate_i, seed=1)
    batch: list[Result] = []
    before = await histograms(url, operator, sims)
    if MODES[mode] is None:
        results_i, span = await interactive
    else:
        (results_i, span), (batch, _) = await asyncio.gather(
            interactive, poisson(nightly, lambda _: url, asks_b, rate_b, seed=2)
        )
    seen = histograms_since(await histograms(url, operator, sims), before)
    # the classes they were served at (one class for all: both standard)
    as_i, as_b = ("interactive", "batch") if named else ("standard", "standard")
    return {
        "interactive": _summary(results_i, span) | seen_by_class(seen, as_i, 2.0),
        "batch": _summary(batch, span)
        | {"above_ceiling": _above(batch, named)}
        | seen_by_class(seen, as_b, BATCH_WAIT_S if named else 2.0),
        "engine_retractions": int(seen.get((RETRACTED, ""), {}).get(math.inf, 0)),
    }


# what the agent and the engines saw: the admission wait (the agent's histogram, by class)
# and the engines' own first token (theirs, by priority), each as {le: count}
Histograms = dict[tuple[str, str], dict[float, float]]
WAIT = "meridian_admission_wait_seconds"
ENGINE_TTFT = "sglang:time_to_first_token_seconds"
RETRACTED = "sglang:num_retracted_requests"  # a counter: {inf: total}, keyed by no class


async def histograms(url: str, operator: str, sims: list[Sim]) -> Histograms:
    out: Histograms = {}
    async with httpx.AsyncClient(timeout=10) as http:
        agent = await http.get(f"{url}/metrics", headers={"Authorization": f"Bearer {operator}"})
        agent.raise_for_status()
        texts = [agent.text]
        texts += [(await http.get(f"{sim.url}/metrics")).text for sim in sims]
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name == RETRACTED:
                total = sum(s.value for s in family.samples if s.name.endswith("_total"))
                counts = out.setdefault((RETRACTED, ""), {math.inf: 0.0})
                counts[math.inf] += total
            if family.name not in (WAIT, ENGINE_TTFT):
                continue
            for sample in family.samples:
                if not sample.name.endswith("_bucket"):
                    continue
                key = sample.labels.get("class") or sample.labels.get("priority", "")
                buckets = out.setdefault((family.name, key), {})
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
    return out


def histograms_since(after: Histograms, before: Histograms) -> Histograms:
    return {key: {le: n - before.get(key, {}).get(le, 0.0) for le, n in buckets.items()}
            for key, buckets in after.items()}  # fmt: skip


def seen_by_class(seen: Histograms, service_class: str, bound: float) -> dict[str, Any]:
    """The class's admission waits (p99, the longest bucket reached, how many past `bound`)
    and its engine TTFT p99 (one class for all: of both tenants together)."""
    waits = seen.get((WAIT, service_class), {})
    engine = seen.get((ENGINE_TTFT, str(engine_priority(ServiceClass.named(service_class)))), {})
    total = max(waits.values(), default=0.0)
    within = max((n for le, n in waits.items() if le <= bound), default=0.0)
    longest = min((le for le, n in waits.items() if n >= total), default=0.0)
    return {
        "admission_wait_p99_s": round(quantile_of(waits, 0.99), 4),
        "admission_wait_at_most_s": longest,
        "admitted_past_bound": int(total - within),
        "engine_ttft_p99_s": round(quantile_of(engine, 0.99), 4),
    }


def _summary(results: list[Result], span: float) -> dict[str, Any]:
    s = summarize(results, span, 2.0, 0.05)
    ok = [r for r in results if r.status == 200]
    s["ttft_max_s"] = round(max((r.ttft_s for r in ok), default=0.0), 4)
    s["ttft_p999_s"] = round(quantile([r.ttft_s for r in ok], 0.999), 4)
    s["classes"] = dict(Counter(r.service_class for r in ok))
    return s


def _above(results: list[Result], named: bool) -> int:
    """Answers of the batch tenant (ceiling `batch`) served at another class."""
    if not named:
        return 0
    return sum(r.status == 200 and r.service_class != "batch" for r in results)


def _verdicts(result: dict[str, Any]) -> None:
    runs = result["results"]
    reference = runs.get("alone", {}).get("interactive", {}).get("ttft_p99_s")
    for mode, run in runs.items():
        i, b = run["interactive"], run["batch"]
        left = max(1e-9, result["capacity_tok_s"] - i["output_tok_per_s"])
        share = b["output_tok_per_s"] / left if MODES[mode] is not None else None
        run["batch_share_of_left"] = round(share, 3) if share is not None else None
        run["ttft_p99_vs_alone"] = round(i["ttft_p99_s"] / reference, 3) if reference else None


def _progress(console: Console, mode: str, run: dict[str, Any]) -> None:
    i, b = run["interactive"], run["batch"]
    console.print(f"  {mode:<10} interactive: ttft p99 {i['ttft_p99_s']:.3f} s (admission "
                  f"wait p99 {i['admission_wait_p99_s']:.3f} s, engine {i['engine_ttft_p99_s']:.3f}"
                  f" s), slo {i['slo_met']:.0%}, refused {i['rejected']}; batch: "
                  f"{b['output_tok_per_s']:.0f} tok/s, refused {b['rejected']}, admission "
                  f"wait p99 {b['admission_wait_p99_s']:.3f} s, past its bound "
                  f"{b['admitted_past_bound']}; engines retracted "
                  f"{run['engine_retractions']}")  # fmt: skip


def _report(console: Console, result: dict[str, Any]) -> None:
    table = Table(title=f"classes: a region of capacity {result['capacity_rps']:.2f} rps "
                        f"({result['capacity_tok_s']:.0f} output tok/s)")  # fmt: skip
    for column in ("mode", "interactive TTFT p99 s", "vs alone", "interactive SLO met",
                   "interactive refused", "batch tok/s", "batch share of left",
                   "batch TTFT max s", "batch refused", "above ceiling"):  # fmt: skip
        table.add_column(column, justify="right")
    for mode, run in result["results"].items():
        i, b = run["interactive"], run["batch"]
        share = run["batch_share_of_left"]
        table.add_row(
            mode, f"{i['ttft_p99_s']:.3f}", f"{run['ttft_p99_vs_alone'] or 0:.2f}x",
            f"{i['slo_met']:.1%}", str(i["rejected"]), f"{b['output_tok_per_s']:.0f}",
            "-" if share is None else f"{share:.0%}", f"{b['ttft_max_s']:.2f}",
            str(b["rejected"]), str(b["above_ceiling"]),
        )  # fmt: skip
    console.print(table)
