"""`meridian bench quality`: how fast the quality guard takes a worker that answers wrong out
of rotation, how many bad answers users got before, and whether it ever takes out a healthy
one.

A control plane on an embedded PostgreSQL and two regions of `--engines` simulated engines
of one model, one node and agent each, all real processes, under steady mixed traffic (chats
streamed and not, answers of 16 to 128 tokens, prompts in several scripts, some conversations
of several turns) of `--streams` clients a region. In each region one engine runs at half
speed for the whole run (a heterogeneous pair; the router sends it less, and it answers
right). The two regions differ in one thing only:

- `canaries`: the agent's defaults (detectors on every answer, canaries every 10 s);
- `detectors`: canaries off (every 3600 s): what the detectors on user answers catch alone.

In one run:

1. **soak** (`--soak` s): healthy engines; every quarantine is a false one (goal: none), and
   the users' TTFT in both regions side by side (canaries run only when a worker has room);
2. **faults**, each made on one engine of a region while traffic flows: its answers turned
   to garbage, to one token repeated, or its log-probabilities shifted ("wrong weights", text
   unchanged; the canaries' only) by 0.3 and 1.0 nats a token. For each: the time from the
   fault until the agent holds the worker, the requests it answered meanwhile (every one a bad
   answer: the worker is faulty from the first), and those as a share of what the worker
   would have answered over the fault's first ten minutes had nothing caught it; then the
   fault is cleared and, where canaries run, the time until the worker is readmitted;
3. **detector cost**: the detectors and the answer's record, timed on answers like the
   gateway's (µs an answer, and a chunk: a streamed answer sends a chunk a token).
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from rich.console import Console
from rich.table import Table

from bench.detector_cost import PROMPTS, detector_cost
from bench.harness import MODEL, apply, start_agent, start_control
from bench.load import quantile
from bench.plots import write_json
from meridian.procs import free_port

MODES = {"canaries": {}, "detectors": {"MERIDIAN_AGENT_CANARY_EVERY_S": "3600"}}
HOSTS = {"canaries": "127.0.0.21", "detectors": "127.0.0.22"}  # engines' ports may coincide
GOALS = {"detect_s": 60.0, "detect_requests": 50, "bad_share": 0.02, "false_quarantines": 0,
         "detector_us_per_chunk": 20.0}  # fmt: skip
NONE = "-"
FAULT_WINDOW_S = 600.0  # a fault nothing caught: its first ten minutes
# fault: (its change, and the modes it is made in: the wrong weights change no text)
FAULTS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "garbage": ({"output": "garbage"}, ("canaries", "detectors")),
    "one token repeated": ({"output": "repeat"}, ("canaries", "detectors")),
    "wrong weights 0.3": ({"logprob_shift": 0.3}, ("canaries",)),
    "wrong weights 1.0": ({"logprob_shift": 1.0}, ("canaries",)),
}
CLEAR = {"output": "none", "logprob_shift": 0.0}


@dataclass
class Options:
    engines: int = 4
    streams: int = 4
    soak_s: float = 600.0
    fault_timeout_s: float = 120.0
    seed: int = 0
    out: Path | None = None
    root: Path = Path(".")


@dataclass
class Served:
    at: float  # when the answer ended
    region: str
    worker: str
    ttft_s: float | None  # streamed answers


@dataclass
class Traffic:
    operator: str
    served: list[Served] = field(default_factory=list)
    failed: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def client(self, http: httpx.AsyncClient, region: str, url: str, seed: int) -> None:
        pick = random.Random(seed)
        headers = {"Authorization": f"Bearer {self.operator}", "x-meridian-debug": "1"}
        history: list[dict[str, str]] = []
        while not self.stop.is_set():
            if not history or pick.random() < 0.5:
                history = []
            history.append({"role": "user", "content": pick.choice(PROMPTS)})
            body = {"model": MODEL, "messages": history, "stream": pick.random() < 0.5,
                    "max_tokens": pick.choice((16, 32, 64, 128))}  # fmt: skip
            started = time.monotonic()
            try:
                text, worker, ttft = await _ask(http, url, body, headers, started)
            except (httpx.HTTPError, ValueError):
                self.failed += 1
                await asyncio.sleep(0.2)
                continue
            history.append({"role": "assistant", "content": text})
            self.served.append(Served(time.monotonic(), region, worker, ttft))

    def between(self, region: str, since: float, until: float) -> list[Served]:
        return [s for s in self.served if s.region == region and since <= s.at <= until]


async def _ask(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str],
    started: float,
) -> tuple[str, str, float | None]:  # fmt: skip
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body,
                           headers=headers) as response:  # fmt: skip
        if response.status_code != 200:
            raise ValueError(f"{response.status_code}: {(await response.aread())[:200]!r}")
        worker = str(orjson.loads(response.headers.get("x-meridian-route", "{}")).get("worker"))
        if not body["stream"]:
            doc = orjson.loads(await response.aread())
            return str(doc["choices"][0]["message"]["content"] or ""), worker, None
        parts, ttft = [], None
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                ttft = ttft if ttft is not None else time.monotonic() - started
                chunk = orjson.loads(line[6:])
                if chunk.get("choices"):
                    parts.append(chunk["choices"][0].get("delta", {}).get("content") or "")
        return "".join(parts), worker, ttft


def fleet_document(ports: dict[str, int], engines: int) -> dict[str, Any]:
    return {
        "apiVersion": "meridian/v1",
        "clouds": [{"name": "local", "provider": "onprem"}],
        "regions": [{"name": r, "cloud": "local", "geography": r, "jurisdiction": "local",
                     "gateway_url": f"http://127.0.0.1:{ports[r]}"} for r in MODES],
        "nodes": [{"name": f"{r}-1", "region": r, "hostname": HOSTS[r],
                   "gpus": [{"index": i, "model": "H100", "memory_gb": 80}
                            for i in range(engines)]} for r in MODES],
        "models": [{"name": MODEL, "source": "bench/model", "context_length": 32768,
                    "min_gpu_memory_gb": 24}],
        "deployments": [{"name": f"model-{r}", "model": MODEL, "region": r, "backend": "sim",
                         "replicas": engines} for r in MODES],
        "routing_policies": [{"name": "model-default", "model": MODEL, "policy": "cost"}],
        "tenants": [{"name": "bench", "tier": "standard"}],
    }  # fmt: skip


class Agent:
    def __init__(self, url: str, operator: str) -> None:
        self.url, self.headers = url, {"Authorization": f"Bearer {operator}"}

    async def status(self, http: httpx.AsyncClient) -> dict[str, Any]:
        answer = await http.get(f"{self.url}/agent/status", headers=self.headers)
        answer.raise_for_status()
        doc: dict[str, Any] = answer.json()
        return doc

    async def held(self, http: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
        return {h["worker"]: h for h in (await self.status(http))["quality"]["held"]}


async def run(options: Options) -> dict[str, Any]:
    console = Console(width=150)
    result: dict[str, Any] = {"options": {k: v for k, v in vars(options).items()
                                          if k not in ("out", "root")}, "goals": GOALS}  # fmt: skip
    with console.status("the detectors' cost an answer"):
        result["detector_cost"] = detector_cost()
    async with AsyncExitStack() as stack, httpx.AsyncClient(timeout=60) as http:
        with console.status("starting a control plane and two regions' agents and engines"):
            cp, admin = await start_control(stack, options.root)
            ports = {r: free_port() for r in MODES}
            await apply(admin, fleet_document(ports, options.engines))
            operator = secrets.token_urlsafe(24)
            agents = {}
            for r, env in MODES.items():
                _, url = await start_agent(stack, options.root, cp, admin, r, f"{r}-1", operator,
                                           ports[r], env=env)  # fmt: skip
                agents[r] = Agent(url, operator)
            engines = {r: await _engines(http, a, options.engines) for r, a in agents.items()}
            for r in MODES:  # one engine at half speed in each: a heterogeneous pair
                await _fault(http, engines[r][0][1], {"slow_factor": 2.0})
            await _canaries_made(http, agents["canaries"])
        traffic = Traffic(operator)
        clients = [asyncio.create_task(traffic.client(http, r, agents[r].url, i * 100 + n))
                   for i, r in enumerate(MODES) for n in range(options.streams)]  # fmt: skip
        try:
            result["soak"] = await _soak(console, http, agents, traffic, options)
            write_json(console, result, options.out)  # each part kept as it is measured
            result["faults"] = []
            for fault, (change, modes) in FAULTS.items():
                for mode in modes:
                    with console.status(f"{fault} in region {mode}"):
                        result["faults"].append(await _one_fault(
                            http, agents[mode], mode, engines[mode], fault, change, traffic,
                            options))  # fmt: skip
                    write_json(console, result, options.out)
            result["failed_requests"] = traffic.failed
        finally:
            traffic.stop.set()
            await asyncio.gather(*clients, return_exceptions=True)
    _report(console, result)
    write_json(console, result, options.out)
    return result


async def _engines(http: httpx.AsyncClient, agent: Agent, count: int) -> list[tuple[str, str]]:
    """(id, url) of the region's engines once all are ready, in id order."""
    async with asyncio.timeout(120):
        while True:
            engines = (await agent.status(http))["engines"]
            ready = [(e["id"], e["url"]) for e in engines if e.get("state") == "ready"]
            if len(ready) == count:
                return sorted(ready)
            await asyncio.sleep(0.5)


async def _canaries_made(http: httpx.AsyncClient, agent: Agent) -> None:
    async with asyncio.timeout(120):
        while MODEL not in (await agent.status(http))["quality"]["canaries"]["made"]:  # noqa: ASYNC110
            await asyncio.sleep(0.5)


async def _fault(http: httpx.AsyncClient, url: str, change: dict[str, Any]) -> None:
    answer = await http.post(f"{url}/sim/faults", json=change)
    answer.raise_for_status()


async def _soak(
    console: Console, http: httpx.AsyncClient, agents: dict[str, Agent], traffic: Traffic,
    options: Options,
) -> dict[str, Any]:  # fmt: skip
    before = {r: await _events(http, a) for r, a in agents.items()}
    started = time.monotonic()
    with console.status("soak: healthy engines under mixed traffic") as status:
        while (elapsed := time.monotonic() - started) < options.soak_s:
            status.update(f"soak: healthy engines under mixed traffic, {elapsed:.0f} of "
                          f"{options.soak_s:.0f} s, {len(traffic.served)} answers")  # fmt: skip
            await asyncio.sleep(1)
    ended = time.monotonic()
    out: dict[str, Any] = {"seconds": round(ended - started, 1), "regions": {}}
    for region, agent in agents.items():
        events = (await _events(http, agent))[len(before[region]) :]
        doc = await agent.status(http)
        served = traffic.between(region, started, ended)
        ttfts = [s.ttft_s for s in served if s.ttft_s is not None]
        hours = options.engines * (ended - started) / 3600
        quarantines = [e for e in events if e["kind"] == "quarantined"]
        out["regions"][region] = {
            "answers": len(served),
            "worker_hours": round(hours, 3),
            "false_quarantines": len(quarantines),
            "per_worker_hour": round(len(quarantines) / hours, 3) if hours else 0.0,
            "alerts": [f"{e['worker']} {e['check']}" for e in events if e["kind"] == "alert"],
            "quarantines": [_said(e) for e in quarantines],
            "ttft_p50_ms": round(quantile(ttfts, 0.5) * 1000, 1) if ttfts else None,
            "ttft_p99_ms": round(quantile(ttfts, 0.99) * 1000, 1) if ttfts else None,
            "canaries_sent": sum(doc["quality"]["canaries"]["sent"].values()),
            "canaries_held_back": sum(doc["quality"]["canaries"]["held_back"].values()),
        }
    return out


def _said(event: dict[str, Any]) -> str:
    return f"{event['worker']} {event['check']} {event['figure']} vs {event['peers_figure']}"


async def _events(http: httpx.AsyncClient, agent: Agent) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = (await agent.status(http))["quality"]["events"]
    return events


async def _one_fault(
    http: httpx.AsyncClient, agent: Agent, mode: str, engines: list[tuple[str, str]],
    fault: str, change: dict[str, Any], traffic: Traffic, options: Options,
) -> dict[str, Any]:  # fmt: skip
    held = await agent.held(http)
    # a full-speed engine not held (the detectors' region keeps those it caught)
    worker, url = next((w, u) for w, u in engines[1:] if w not in held)
    await _fault(http, url, change)
    made = time.monotonic()
    row: dict[str, Any] = {"fault": fault, "mode": mode, "worker": worker}
    caught: dict[str, Any] | None = None
    while time.monotonic() - made < options.fault_timeout_s:
        caught = (await agent.held(http)).get(worker)
        if caught is not None:
            break
        await asyncio.sleep(0.2)
    took = time.monotonic() - made
    await asyncio.sleep(1.0)  # answers under way when it was caught have ended
    answered = [s for s in traffic.between(mode, made, made + took) if s.worker == worker]
    region = traffic.between(mode, made, made + took)
    rate = len(region) / took if took else 0.0
    would = rate * FAULT_WINDOW_S / options.engines  # its share of ten minutes' answers
    row.update({
        "caught": caught is not None,
        "by": caught["check"] if caught else None,
        "evidence": f"{caught['figure']} vs {caught['peers_figure']}" if caught else None,
        "detect_s": round(took, 1),
        "requests_before": len(answered),
        "bad_answers_before": len(answered),
        "bad_share": round(len(answered) / would, 4) if would else None,
        "region_rps": round(rate, 1),
    })  # fmt: skip
    await _fault(http, url, CLEAR)
    row["readmitted_s"] = None
    if mode == "canaries" and caught is not None:
        cleared = time.monotonic()
        while time.monotonic() - cleared < options.fault_timeout_s:
            if worker not in await agent.held(http):
                row["readmitted_s"] = round(time.monotonic() - cleared, 1)
                break
            await asyncio.sleep(0.2)
    return row


def _report(console: Console, result: dict[str, Any]) -> None:
    table = Table(title="faults: time and requests until the worker is held")
    for column in ("fault", "region mode", "caught by", "evidence", "seconds", "its requests "
                   "(all bad)", "share of its 10 min", "readmitted after s"):  # fmt: skip
        table.add_column(column, justify="right")
    for f in result["faults"]:
        table.add_row(
            f["fault"], f["mode"], f["by"] or "not caught", f["evidence"] or NONE,
            f"{f['detect_s']:.1f}", str(f["requests_before"]),
            NONE if f["bad_share"] is None else f"{f['bad_share']:.2%}",
            NONE if f["readmitted_s"] is None else f"{f['readmitted_s']:.1f}",
        )  # fmt: skip
    console.print(table)
    soak = Table(title=f"soak: {result['soak']['seconds']:.0f} s of healthy engines, one at half "
                 "speed in each region")  # fmt: skip
    for column in ("region mode", "answers", "worker-hours", "false quarantines",
                   "per worker-hour", "alerts", "TTFT p50 ms", "TTFT p99 ms", "canaries sent",
                   "held back"):  # fmt: skip
        soak.add_column(column, justify="right")
    for mode, r in result["soak"]["regions"].items():
        soak.add_row(mode, str(r["answers"]), f"{r['worker_hours']:.2f}",
                     str(r["false_quarantines"]), f"{r['per_worker_hour']:.2f}",
                     ", ".join(r["alerts"]) or "none", str(r["ttft_p50_ms"]),
                     str(r["ttft_p99_ms"]), str(r["canaries_sent"]),
                     str(r["canaries_held_back"]))  # fmt: skip
    console.print(soak)
    cost = Table(title="detector cost (the detectors and the answer's record, best of 5)")
    for column in ("answer", "µs an answer", "chunks", "µs a chunk"):
        cost.add_column(column, justify="right")
    for name, c in result["detector_cost"].items():
        if isinstance(c, dict):
            cost.add_row(name, f"{c['per_answer_us']:.2f}", str(c["chunks"]),
                         f"{c['per_chunk_us']:.3f}")  # fmt: skip
    console.print(cost)
    console.print(f"requests that failed: {result['failed_requests']}")
