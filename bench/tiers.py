"""`meridian bench tiers`: a tiered route (`chat-auto`: `small`, then `large`, 4x slower a
token) against sending everything to the strong model, on the same number of simulated
engines, all real processes: a control plane on an embedded PostgreSQL, one agent, and the
simulators (2 `small` and 2 `large` for the tiered route; 4 `large` for strong-only).

The workload: OpenAI chat streams of mixed difficulty (`--easy` of them short questions,
then questions over a long context, then code and math), and multi-turn chats of which a
fifth turn hard on their third turn. The tenant has opted in to tiering.

Reported:
- **classifier cost**: the built-in classifier and the tier's choice, in this process, per
  request of the workload (p50, p99; goal p99 <= 2 ms), and the body's re-encoding with the
  tier's name;
- **GPU-seconds saved**: the simulated engines' busy time (the seconds their steps took) for
  the same requests at the same rate, tiered against strong-only;
- **capacity at 90% SLO**: the highest Poisson rate at which 90% of requests meet the same
  SLO (TTFT, mean inter-token gap) for both, from a sweep (goal: tiered >= 1.5x);
- **multi-turn hit rate**: prompt tokens served from the cache, tiered against untiered
  (everything to `large`; goal: within 5 points).

Quality (whether the cheap tier's answers are as good as the strong tier's) cannot be judged
on simulators: see README.md, "Tiered routes", for the hook a judged evaluation uses.
"""

from __future__ import annotations

import asyncio
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
    IMMEDIATE,
    REGION,
    Sim,
    apply,
    cache_counters,
    flush,
    start_agent,
    start_control,
    start_sims,
)
from bench.load import Client, Conversation, Req, play_conversations, poisson, summarize, sweep
from bench.plots import write_json
from bench.tier_cost import LARGE, ROUTE, SMALL, classifier_cost

STRONG_ONLY = "large-all"
POOL = 200_000  # each simulator's KV pool, in tokens
GOALS = {"classifier_p99_ms": 2.0, "capacity_ratio": 1.5, "hit_rate_points": 5.0}
CODE = ("```python\ndef f{n}(xs):\n    return [x * {n} for x in xs if x % 3]\n```\n"
        "Rewrite f{n} to run in place and prove it returns the same list.")  # fmt: skip
MATH = "Solve for x: {n}x^2 + 3x = {m}. Then prove the root is unique on x > 0."


@dataclass
class Options:
    requests: int = 240  # a phase of the sweep, at most
    easy: float = 0.6  # the share of short questions; then a fifth long-context, then hard
    start_rps: float = 2.0
    growth: float = 1.5
    max_phases: int = 10
    phase_s: float = 30.0
    ttft_slo_s: float = 2.0
    itl_slo_s: float = 0.06  # the strong model's step is about 25 ms at its batch
    max_running: int = 4  # requests an engine runs at once: it saturates at rates this
    # machine's two cores can drive (the routing bench's engines batch 256)
    chats: int = 40
    turns: int = 4
    seed: int = 3
    judge: str | None = None  # a judge's URL: the cheap tier's answers judged (real GPUs)
    judge_sample: int = 100
    out: Path | None = None
    root: Path = Path(".")


def workload(o: Options, count: int, seed: int) -> list[Req]:
    """Mixed difficulty: short questions; questions over a long context; code and math."""
    rng = random.Random(seed)
    reqs = []
    for i in range(count):
        roll = rng.random()
        if roll < o.easy:
            text = f"In a sentence, what is {rng.choice(WORDS)} {i}?"
            reqs.append(Req([{"role": "user", "content": text}], 48, 0))
        elif roll < o.easy + (1 - o.easy) / 2:
            context = " ".join(rng.choice(WORDS) for _ in range(400))
            text = f"{context}\n\nSummarise the above in two lines ({i})."
            reqs.append(Req([{"role": "user", "content": text}], 64, 1))
        else:
            text = (CODE if rng.random() < 0.5 else MATH).format(n=i, m=rng.randrange(99))
            reqs.append(Req([{"role": "user", "content": text}], 128, 2))
    return reqs


WORDS = ("river", "mountain", "harbour", "lantern", "meadow", "engine", "quartz", "orchard",
         "glacier", "violin", "compass", "tundra", "canyon", "ember", "falcon")  # fmt: skip


def chats(o: Options, seed: int) -> list[Conversation]:
    """Multi-turn chats over one shared system prompt; a fifth turn hard on their third turn."""
    rng = random.Random(seed)
    system = " ".join(rng.choice(WORDS) for _ in range(600))
    out = []
    for c in range(o.chats):
        questions = [f"And what about {rng.choice(WORDS)} {c}-{t}?" for t in range(o.turns)]
        if c % 5 == 0 and o.turns > 2:
            questions[2] = CODE.format(n=c)
        out.append(Conversation(system, questions, 48))
    return out


def fleet(smalls: list[Sim], larges: list[Sim], slo: dict[str, int]) -> dict[str, Any]:
    models = [{"name": m, "source": "meridian/sim", "context_length": 131072,
               "capabilities": ["chat", "completion", "tools"]}
              for m in (SMALL, LARGE, STRONG_ONLY)]  # fmt: skip
    pools = {SMALL: smalls, LARGE: larges[:2], STRONG_ONLY: larges}
    return {
        "apiVersion": "meridian/v1",
        "clouds": [{"name": "local", "provider": "onprem"}],
        "regions": [{"name": REGION, "cloud": "local", "geography": "local",
                     "jurisdiction": "local"}],
        "nodes": [{"name": f"{REGION}-1", "region": REGION, "hostname": "127.0.0.1"}],
        "models": models,
        "deployments": [{"name": m, "model": m, "region": REGION, "backend": "external",
                         "external_urls": [s.url for s in sims]} for m, sims in pools.items()],
        "routing_policies": [{"name": m, "model": m, "policy": "cost",
                              "params": {"kv_events": False}, **slo} for m in pools],
        "tiered_routes": [{"name": ROUTE, "tiers": [SMALL, LARGE]}],
        "tenants": [{"name": "bench", "tier": "standard", "tiering": True}],
        "rollout_policies": IMMEDIATE,
    }  # fmt: skip


@dataclass
class Bench:
    options: Options
    console: Console
    gateway: str
    smalls: list[Sim]
    larges: list[Sim]
    key: str
    result: dict[str, Any] = field(default_factory=dict)

    def sims(self, model: str) -> list[Sim]:
        return self.smalls + self.larges[:2] if model == ROUTE else self.larges

    async def phase(self, model: str, reqs: list[Req], rate: float, seed: int) -> dict[str, Any]:
        """One run at `rate` from cold caches: the summary, the tiers' split, busy seconds."""
        sims = self.sims(model)
        await flush(sims)
        before = await busy(sims)
        client = Client({"Authorization": f"Bearer {self.key}"}, model)
        try:
            results, span = await poisson(client, lambda _: self.gateway, reqs, rate, seed)
        finally:
            await client.close()
        await asyncio.sleep(0.5)
        summary = summarize(results, span, self.options.ttft_slo_s, self.options.itl_slo_s)
        summary["rate_rps"] = round(rate, 3)
        summary["gpu_seconds"] = round(await busy(sims) - before, 2)
        summary["tiers"] = dict(client.tiers)
        return summary


async def busy(sims: list[Sim]) -> float:
    """The simulators' busy seconds (their steps' time), summed."""
    total = 0.0
    async with httpx.AsyncClient(timeout=5) as http:
        for sim in sims:
            for line in (await http.get(f"{sim.url}/metrics")).text.splitlines():
                if line.startswith("meridian_sim_busy_seconds "):
                    total += float(line.split()[1])
    return total


async def run(options: Options) -> dict[str, Any]:
    console = Console(width=140)
    o = options
    result: dict[str, Any] = {"options": {k: v for k, v in vars(o).items()
                                          if k not in ("out", "root")}, "goals": GOALS}  # fmt: skip
    with console.status("the classifier's cost, in this process"):
        result["classifier"] = await classifier_cost(workload(o, 2000, o.seed))
    console.print(f"classifier: p50 {result['classifier']['p50_us']} µs, "
                  f"p99 {result['classifier']['p99_us']} µs a request")  # fmt: skip
    write_json(console, result, o.out)
    async with AsyncExitStack() as stack:
        with console.status("starting 2 small and 4 large simulators, a control plane, an agent"):
            extra = ("--max-running-requests", str(o.max_running))
            smalls = await start_sims(stack, 2, max_total_tokens=POOL, stream_interval=4,
                                      log_dir=o.root, model=SMALL, extra=extra)  # fmt: skip
            larges = await start_sims(stack, 4, max_total_tokens=POOL, stream_interval=4,
                                      log_dir=o.root, model=LARGE, speeds=[0.25] * 4,
                                      extra=extra)  # fmt: skip
            cp, admin = await start_control(stack, o.root)
            slo = {"slo_ttft_ms": int(o.ttft_slo_s * 1000), "slo_itl_ms": int(o.itl_slo_s * 1000)}
            await apply(admin, fleet(smalls, larges, slo))
            operator = "bench-operator-token-0123456789"
            _, gateway = await start_agent(stack, o.root, cp, admin, REGION, f"{REGION}-1",
                                           operator)  # fmt: skip
            key = (await admin.post("/v1/api-keys", json={"tenant": "bench"})).json()["key"]
            await _serving(gateway, key, operator)
        bench = Bench(o, console, gateway, smalls, larges, key, result)
        await _gpu_seconds(bench)
        write_json(console, result, o.out)
        await _capacity(bench)
        write_json(console, result, o.out)
        await _multi_turn(bench)
        if o.judge is not None:
            write_json(console, result, o.out)
            await _judged(bench, o.judge)
    _report(console, result)
    write_json(console, result, o.out)
    return result


async def _serving(gateway: str, key: str, operator: str) -> None:
    """Once the agent knows the key and every worker."""
    async with httpx.AsyncClient(timeout=10) as http:
        for _ in range(300):
            status = (
                await http.get(
                    f"{gateway}/agent/status", headers={"Authorization": f"Bearer {operator}"}
                )
            ).json()
            body = {"model": ROUTE, "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 2}  # fmt: skip
            answer = await http.post(f"{gateway}/v1/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {key}"})  # fmt: skip
            if len(status["router"]["workers"]) == 8 and answer.status_code == 200:
                await asyncio.sleep(1.0)
                return
            await asyncio.sleep(0.2)
    raise RuntimeError("the agent did not come to serve the tiered route")


async def _gpu_seconds(bench: Bench) -> None:
    o = bench.options
    reqs = workload(o, 160, o.seed + 1)
    rate = o.start_rps
    out: dict[str, Any] = {"rate_rps": rate}
    for model in (ROUTE, STRONG_ONLY):
        with bench.console.status(f"GPU-seconds: {model} at {rate} rps"):
            out[model] = await bench.phase(model, reqs, rate, seed=11)
    tiered, strong = out[ROUTE]["gpu_seconds"], out[STRONG_ONLY]["gpu_seconds"]
    out["saved"] = round(1 - tiered / strong, 4) if strong else None
    bench.result["gpu_seconds"] = out
    bench.console.print(f"GPU-seconds at {rate} rps: tiered {tiered}, strong-only {strong} "
                        f"(saved {out['saved']:.0%}); tiers {out[ROUTE]['tiers']}")  # fmt: skip


async def _capacity(bench: Bench) -> None:
    o = bench.options
    out: dict[str, Any] = {}
    for model in (ROUTE, STRONG_ONLY):
        capacity, phases = await _sweep(bench, model)
        out[model] = {"capacity_rps": round(capacity, 3), "phases": phases}
    strong = out[STRONG_ONLY]["capacity_rps"]
    out["ratio"] = round(out[ROUTE]["capacity_rps"] / strong, 3) if strong else None
    out["slo"] = {"ttft_s": o.ttft_slo_s, "itl_s": o.itl_slo_s, "met_by": 0.9}
    bench.result["capacity"] = out


async def _sweep(bench: Bench, model: str) -> tuple[float, list[dict[str, Any]]]:
    """The highest rate at which 90% meet the SLO (bench/load.py's sweep)."""
    o = bench.options
    phases: list[dict[str, Any]] = []

    async def passes(rate: float, seed: int) -> bool:
        count = min(o.requests, max(48, round(rate * o.phase_s)))
        summary = await bench.phase(model, workload(o, count, o.seed + seed), rate, seed)
        phases.append(summary)
        bench.console.print(
            f"  {model:<10} {rate:6.2f} rps: slo {summary['slo_met']:.0%}, ttft p99 "
            f"{summary['ttft_p99_s']:.2f} s, itl p99 {summary['itl_p99_s'] * 1000:.0f} ms, "
            f"failed {summary['failed']}, tiers {summary['tiers']}"
        )
        return bool(summary["slo_met"] >= 0.9)

    return await sweep(o.start_rps, o.growth, o.max_phases, passes), phases


async def _multi_turn(bench: Bench) -> None:
    o = bench.options
    out: dict[str, Any] = {}
    rate = o.chats / 20  # conversations started a second
    for model in (ROUTE, LARGE):
        sims = bench.sims(ROUTE) if model == ROUTE else bench.larges[:2]
        await flush(sims)
        before = await cache_counters(sims)
        client = Client({"Authorization": f"Bearer {bench.key}"}, model)
        with bench.console.status(f"multi-turn chats: {model}"):
            try:
                results, span = await play_conversations(
                    client, lambda _: bench.gateway, chats(o, o.seed), rate, o.seed
                )
            finally:
                await client.close()
        after = await cache_counters(sims)
        prompt, cached = after[0] - before[0], after[1] - before[1]
        summary = summarize(results, span, o.ttft_slo_s, o.itl_slo_s)
        summary["hit_rate"] = round(cached / prompt, 4) if prompt else 0.0
        summary["tiers"] = dict(client.tiers)
        out["tiered" if model == ROUTE else "untiered"] = summary
    out["points"] = round((out["untiered"]["hit_rate"] - out["tiered"]["hit_rate"]) * 100, 2)
    bench.result["multi_turn"] = out


async def _judged(bench: Bench, judge: str) -> None:
    """The hook for a judged evaluation: for a sample of the requests the route sends to a
    cheaper tier, the strongest tier is asked too, and the judge answers whether the cheaper
    answer is as good. Meaningless on simulators; for real engines."""
    o = bench.options
    auth = {"Authorization": f"Bearer {bench.key}"}
    judged = good = 0
    async with httpx.AsyncClient(timeout=300) as http:
        for req in workload(o, o.judge_sample * 4, o.seed + 7):
            if judged >= o.judge_sample:
                break
            body = {"messages": req.messages, "max_tokens": req.max_tokens}
            cheap = await http.post(f"{bench.gateway}/v1/chat/completions",
                                    json={**body, "model": ROUTE}, headers=auth)  # fmt: skip
            if cheap.status_code != 200 or cheap.json()["model"] == LARGE:
                continue
            strong = await http.post(f"{bench.gateway}/v1/chat/completions",
                                     json={**body, "model": LARGE}, headers=auth)  # fmt: skip
            if strong.status_code != 200:
                continue
            verdict = await http.post(judge, json={
                "messages": req.messages,
                "cheap": {"model": cheap.json()["model"], "text": _text(cheap.json())},
                "strong": {"model": LARGE, "text": _text(strong.json())},
            })  # fmt: skip
            verdict.raise_for_status()
            judged += 1
            good += bool(verdict.json().get("as_good"))
    bench.result["judged"] = {"judge": judge, "judged": judged,
                              "as_good": round(good / judged, 4) if judged else None}  # fmt: skip


def _text(answer: dict[str, Any]) -> str:
    return str(answer["choices"][0]["message"].get("content") or "")


def _report(console: Console, result: dict[str, Any]) -> None:
    c, goals = result["classifier"], result["goals"]
    table = Table(title="tiered routes against the strong model alone (same engine count)")
    for column in ("figure", "tiered", "strong only / untiered", "goal", "met"):
        table.add_column(column, justify="right")
    table.add_row("classifier p50 / p99 µs", f"{c['p50_us']} / {c['p99_us']}", "",
                  f"p99 <= {goals['classifier_p99_ms'] * 1000:.0f}",
                  _met(c["p99_us"] <= goals["classifier_p99_ms"] * 1000))  # fmt: skip
    g = result.get("gpu_seconds")
    if g:
        table.add_row("GPU-seconds, same requests", f"{g[ROUTE]['gpu_seconds']}",
                      f"{g[STRONG_ONLY]['gpu_seconds']}", "",
                      f"saved {g['saved']:.0%}" if g["saved"] is not None else "")  # fmt: skip
    cap = result.get("capacity")
    if cap:
        ratio = cap["ratio"]
        table.add_row("capacity at 90% SLO, rps", f"{cap[ROUTE]['capacity_rps']}",
                      f"{cap[STRONG_ONLY]['capacity_rps']}",
                      f">= {goals['capacity_ratio']}x",
                      _met(ratio is not None and ratio >= goals["capacity_ratio"]) +
                      (f" ({ratio}x)" if ratio is not None else ""))  # fmt: skip
    m = result.get("multi_turn")
    if m:
        table.add_row("multi-turn hit rate", f"{m['tiered']['hit_rate']:.1%}",
                      f"{m['untiered']['hit_rate']:.1%}",
                      f"within {goals['hit_rate_points']:.0f} points",
                      _met(m["points"] <= goals["hit_rate_points"]) +
                      f" ({m['points']} points)")  # fmt: skip
    console.print(table)
    if g:
        console.print(f"tiers of the GPU-seconds run: {g[ROUTE]['tiers']}")
    if m:
        console.print(f"tiers of the multi-turn chats: {m['tiered']['tiers']}")
    j = result.get("judged")
    if j:
        console.print(f"judged by {j['judge']}: {j['as_good']} of {j['judged']} cheaper answers "
                      "as good as the strongest tier's")  # fmt: skip
    console.print(f"statuses: {Counter(str(p.get('statuses')) for p in _phases(result))}")


def _phases(result: dict[str, Any]) -> list[dict[str, Any]]:
    cap = result.get("capacity") or {}
    return [p for model in (ROUTE, STRONG_ONLY) for p in cap.get(model, {}).get("phases", [])]


def _met(ok: bool) -> str:
    return "yes" if ok else "NO"
