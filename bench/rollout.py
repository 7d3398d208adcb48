"""`meridian bench rollout`: harmful changes caught at the canary, good ones rolled everywhere.

A control plane on an embedded PostgreSQL and three regions (1, 2 and 4 GPUs, one node and
agent each, simulated engines managed by the agents), all real processes, under steady
streamed traffic into every region. The rollout policy is the default's shape (canary
region, then one region, then the rest) with a shorter bake. In one run:

- **baseline**: no change, for `--baseline` seconds: the share of requests that fail or miss
  the SLO without any change;
- **harmful changes**, each applied to every region in one revision, `--repeat` times each
  (containment must hold every time, not once): engines that crash as they start, engines
  30 times slower (TTFT past the SLO), admission limits so low that most requests get 429, a
  TTFT SLO of 1 ms, routing that sends a region's every request to one worker. For each
  run: the regions that ever held it, the time from the write to the rollback decided and
  to the rollback in force on every agent that held it, the share of the fleet's requests
  that saw the harm (failed, refused other than by quota, or missed the SLO, or served by
  another region than the one asked) over the minute after the write (or to the rollback's
  end, if later), less the baseline's share, and the rollout's checks as the leader judged
  them through the run (every half second: wave, state, each check's verdict and figure),
  so that a run that was not contained can be read afterwards (bench/rollout_record.py);
- **good changes**: `--good` changes of the TTFT SLO, each waited to its end: the time from the
  write to the last region, and the rollbacks among them (false rollbacks);
- **revocation during a paused rollout**: `--revocations` keys revoked while a rollout is
  paused: from the PATCH to the key failing (401) in every region.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from bench.harness import MODEL, apply, start_agent, start_control
from bench.plots import write_json
from bench.revocation import _summary, _until
from bench.rollout_record import report, watch
from meridian.procs import free_port

REGIONS = {"small": 1, "medium": 2, "large": 4}  # GPUs, and engines
HOSTS = {"small": "127.0.0.11", "medium": "127.0.0.12", "large": "127.0.0.13"}
SLO_TTFT_MS = 1000
HARM_WINDOW_S = 60.0  # a harmful change's harm: the fleet's requests of the minute after it
GOALS = {"regions": 1, "harm_share": 0.05, "rollback_s": 60.0, "false_rollbacks": 0,
         "revocation_p99_s": 1.0}  # fmt: skip
HARMFUL: dict[str, dict[str, Any]] = {
    "engines crash on start": {"deployments": {"crash-after-s": 0.5}},
    "engines 30x slower (TTFT past the SLO)": {"deployments": {"slow-factor": 30}},
    "admission limits: most requests 429": {"policy": {"max_inflight": 1, "max_queue": 0}},
    "a TTFT SLO of 1 ms": {"policy": {"slo_ttft_ms": 1}},
    # identical prompts, no balancing: every request of a region to the one worker that
    # holds the prefix
    "routing that loads one worker": {
        "policy": {
            "policy": "cache_aware",
            "params": {
                "cache_threshold": 0.0,
                "balance_abs_threshold": 1_000_000,
                "balance_rel_threshold": 1_000_000.0,
            },
        }
    },
}


@dataclass
class Options:
    bake_s: float = 5.0
    baseline_s: float = 20.0
    good: int = 20
    revocations: int = 20
    streams: int = 3  # concurrent streams into each region
    rps: float | None = None  # instead: requests a second into each region, paced (light load)
    checks: dict[str, float] = field(default_factory=dict)  # the rollout policy's, if not default
    repeat: int = 3  # runs of each harmful change
    out: Path | None = None
    root: Path = Path(".")


@dataclass
class Answer:
    at: float
    region: str
    outcome: str  # ok | slow | elsewhere (a peer region served it) | refused | failed | quota


@dataclass
class Load:
    answers: list[Answer] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def stream(self, http: httpx.AsyncClient, region: str, url: str, key: str) -> None:
        while not self.stop.is_set():
            if await self.one(http, region, url, key) != "ok":
                await asyncio.sleep(0.05)

    async def paced(
        self, http: httpx.AsyncClient, region: str, url: str, key: str, rps: float
    ) -> None:
        """`rps` requests a second, each in its own task, whatever the answers take: the
        light, open load of a region that is mostly idle."""
        tasks: set[asyncio.Task[str]] = set()
        while not self.stop.is_set():
            task = asyncio.create_task(self.one(http, region, url, key))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(1 / rps)
        await asyncio.gather(*tasks)

    async def one(self, http: httpx.AsyncClient, region: str, url: str, key: str) -> str:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "a short answer"}],
                "max_tokens": 8, "stream": True}  # fmt: skip
        # the bench's tenant may see its routes: an answer a peer gave is served elsewhere
        headers = {"Authorization": f"Bearer {key}", "x-meridian-debug": "1"}
        started, first, outcome = time.monotonic(), None, "failed"
        try:
            async with http.stream("POST", f"{url}/v1/chat/completions", json=body,
                                   headers=headers) as response:  # fmt: skip
                if response.status_code == 429 or response.status_code == 503:
                    text = (await response.aread()).decode()
                    outcome = "quota" if "quota_exceeded" in text else "refused"
                elif response.status_code == 200:
                    # an escalated answer's route receipt is {"escalated": {...}}
                    elsewhere = '"escalated"' in response.headers.get("x-meridian-route", "")
                    async for line in response.aiter_lines():
                        if line.startswith("data: ") and first is None:
                            first = time.monotonic()
                        if line.startswith('data: {"error"'):
                            break
                        if line == "data: [DONE]":
                            ttft_ms = ((first or started) - started) * 1000
                            outcome = "ok" if ttft_ms <= SLO_TTFT_MS else "slow"
                            outcome = "elsewhere" if elsewhere else outcome
        except httpx.HTTPError:
            pass
        self.answers.append(Answer(time.monotonic(), region, outcome))
        return outcome

    def bad_share(self, since: float, until: float) -> tuple[float, int]:
        window = [a for a in self.answers if since <= a.at <= until and a.outcome != "quota"]
        if not window:
            return 0.0, 0
        return sum(a.outcome != "ok" for a in window) / len(window), len(window)


def fleet_document(
    ports: dict[str, int], bake_s: float, checks: dict[str, float] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "meridian/v1",
        "clouds": [{"name": "local", "provider": "onprem"}],
        "regions": [{"name": r, "cloud": "local", "geography": r, "jurisdiction": "local",
                     "gateway_url": f"http://127.0.0.1:{ports[r]}"} for r in REGIONS],
        "nodes": [{"name": f"{r}-1", "region": r, "hostname": HOSTS[r],
                   "gpus": [{"index": i, "model": "H100", "memory_gb": 80} for i in range(n)]}
                  for r, n in REGIONS.items()],
        "models": [{"name": MODEL, "source": "bench/model", "context_length": 32768,
                    "min_gpu_memory_gb": 24}],
        "deployments": [_deployment(r, {}) for r in REGIONS],
        "routing_policies": [_policy({})],
        "fallback_rules": [{"name": f"{r}-out", "region": r,
                            "peers": [p for p in REGIONS if p != r]} for r in REGIONS],
        "tenants": [{"name": "bench", "tier": "standard", "requests_per_minute": 10_000_000,
                     "debug_routes": True}],
        "rollout_policies": [{"name": "default", "bake_s": bake_s,
                              "checks": {"min_requests": 10, "wait_for_traffic_s": 120,
                                         **(checks or {})}}],
    }  # fmt: skip


def _deployment(region: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": f"model-{region}", "model": MODEL, "region": region, "backend": "sim",
            "replicas": REGIONS[region], "engine_args": args}  # fmt: skip


def _policy(extra: dict[str, Any], slo: int = SLO_TTFT_MS) -> dict[str, Any]:
    return {"name": "model-default", "model": MODEL, "policy": "cost", "slo_ttft_ms": slo,
            **extra}  # fmt: skip


async def run(options: Options) -> dict[str, Any]:
    console = Console(width=130)
    result: dict[str, Any] = {"options": {k: v for k, v in vars(options).items()
                                          if k not in ("out", "root")}, "goals": GOALS}  # fmt: skip
    async with AsyncExitStack() as stack:
        with console.status("starting a control plane and three regions' agents and engines"):
            cp, admin = await start_control(stack, options.root)
            ports = {r: free_port() for r in REGIONS}
            await apply(admin, fleet_document(ports, options.bake_s, options.checks))
            operator = secrets.token_urlsafe(24)
            for r in REGIONS:
                await start_agent(stack, options.root, cp, admin, r, f"{r}-1", operator, ports[r],
                                  env={"MERIDIAN_AGENT_HEARTBEAT_S": "1"})  # fmt: skip
            key = (await admin.post("/v1/api-keys", json={"tenant": "bench"})).json()["key"]
            gateways = {r: f"http://127.0.0.1:{p}" for r, p in ports.items()}
            await _serving(gateways, key)
        load = Load()
        async with httpx.AsyncClient(timeout=60) as http:
            rps, each = options.rps, options.streams
            streams = [asyncio.create_task(load.paced(http, r, u, key, rps) if rps is not None
                                           else load.stream(http, r, u, key))
                       for r, u in gateways.items() for _ in range(1 if rps else each)]  # fmt: skip
            try:
                with console.status("baseline: steady traffic, no change"):
                    start = time.monotonic()
                    await asyncio.sleep(options.baseline_s)
                    baseline, counted = load.bad_share(start, time.monotonic())
                result["baseline"] = {"bad_share": round(baseline, 4), "requests": counted}
                result["harmful"] = []
                for name, change in HARMFUL.items():
                    for n in range(options.repeat):
                        with console.status(f"harmful: {name} ({n + 1} of {options.repeat})"):
                            result["harmful"].append(
                                await _harmful(admin, load, name, change, baseline)
                            )
                        write_json(console, result, options.out)  # each part as measured
                with console.status("good changes") as status:
                    result["good"] = await _good(admin, options.good, status)
                write_json(console, result, options.out)
                with console.status("revocation while a rollout is paused"):
                    result["revocation"] = await _revocations(admin, http, gateways,
                                                              options.revocations)  # fmt: skip
            finally:
                load.stop.set()
                await asyncio.gather(*streams)
    report(console, result)
    write_json(console, result, options.out)
    return result


async def _serving(gateways: dict[str, str], key: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with httpx.AsyncClient(timeout=10) as http:
        for url in gateways.values():
            for _ in range(600):
                try:
                    auth = {"Authorization": f"Bearer {key}"}
                    answer = await http.post(f"{url}/v1/chat/completions", json=body, headers=auth)
                    if answer.status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError(f"{url} does not serve")


async def _write(admin: httpx.AsyncClient, doc: dict[str, Any]) -> int:
    answer = await admin.post("/v1/apply", params={"prune": "false"}, json=doc)
    answer.raise_for_status()
    return int(answer.json()["revision"])


async def _ended(admin: httpx.AsyncClient, revision: int, within_s: float = 600) -> dict[str, Any]:
    """The rollout of `revision` once it ends, or pauses (too little to judge: the operator's
    call, which the bench makes by aborting it, so that the next change starts afresh)."""
    deadline = time.monotonic() + within_s
    row = None
    while time.monotonic() < deadline:
        doc: dict[str, Any] = (await admin.get("/v1/rollouts")).json()
        row = doc["rollout"]
        if row and row["revision"] == revision and row["state"] != "rolling":
            if row["state"] == "paused":
                (await admin.post("/v1/rollouts/current/abort")).raise_for_status()
            return doc
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the rollout of revision {revision} did not end in {within_s:g} s: {row}")


async def _harmful(admin: httpx.AsyncClient, load: Load, name: str, change: dict[str, Any],
                   baseline: float) -> dict[str, Any]:  # fmt: skip
    args = change.get("deployments")
    doc: dict[str, Any] = (
        {"deployments": [_deployment(r, args) for r in REGIONS]} if args is not None
        else {"routing_policies": [_policy(change["policy"])]}
    )  # fmt: skip
    written = time.monotonic()
    revision = await _write(admin, doc)
    timeline: list[dict[str, Any]] = []
    watching = asyncio.create_task(watch(admin, revision, written, timeline))
    try:
        ended = await _ended(admin, revision)
    finally:
        watching.cancel()
    decided = time.monotonic()
    row = ended["rollout"]
    held = [t for w in row["waves"] if w["status"] == "rolled_back" for t in w["targets"]]
    rollback = await _rollback_revision(admin, row["id"])
    nodes = [f"{t.split(':', 1)[1]}-1" for t in held]
    in_force = await _applied(admin, nodes, rollback) if rollback is not None else decided
    await asyncio.sleep(5)  # what the rollback left: engines coming back
    # the harm of the minute after the write (or longer, to the rollback's end and after)
    until = max(written + HARM_WINDOW_S, time.monotonic())
    await asyncio.sleep(until - time.monotonic())
    share, counted = load.bad_share(written, until)
    # undo: the fleet's declared state back to the good one
    await _ended(admin, await _write(admin, {"deployments": [_deployment(r, {}) for r in REGIONS],
                                             "routing_policies": [_policy({})]}))  # fmt: skip
    await asyncio.sleep(3)
    return {
        "change": name, "state": row["state"], "reason": row["reason"][:200],
        "regions_held": len(held), "write_to_rollback_s": round(decided - written, 2),
        "write_to_rollback_in_force_s": round(in_force - written, 2),
        "harm_share": round(max(0.0, share - baseline), 4), "requests": counted,
        # held by one region at most and rolled back in time, or harming no one at this load
        "contained": share - baseline <= GOALS["harm_share"] and (
            (len(held) <= GOALS["regions"] and row["state"] == "rolled_back"
             and decided - written <= GOALS["rollback_s"])
            or share - baseline <= 0.0),
        "timeline": timeline,
    }  # fmt: skip


async def _rollback_revision(admin: httpx.AsyncClient, rollout: int) -> int | None:
    events = (await admin.get("/v1/audit-events",
                              params={"kind": "rollout", "name": str(rollout)})).json()  # fmt: skip
    return next((int(e["revision"]) for e in events["items"] if e["action"] == "rollback"), None)


async def _applied(admin: httpx.AsyncClient, nodes: list[str], revision: int) -> float:
    """When every node named runs `revision` or later (monotonic clock)."""
    for _ in range(3000):
        statuses = [(await admin.get(f"/v1/nodes/{n}")).json()["status"] for n in nodes]
        if all((s["applied_revision"] or 0) >= revision for s in statuses):
            return time.monotonic()
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{nodes} did not apply revision {revision}")


async def _good(admin: httpx.AsyncClient, count: int, status: Any) -> dict[str, Any]:
    times: list[float] = []
    outcomes: Counter[str] = Counter()
    reasons: list[str] = []
    for n in range(count):
        status.update(f"good change {n + 1} of {count}")
        written = time.monotonic()
        doc = await _ended(admin, await _write(admin, {"routing_policies": [
            _policy({}, SLO_TTFT_MS + 1 + n % 2)]}))  # fmt: skip
        row = doc["rollout"]
        outcomes[row["state"]] += 1
        if row["state"] == "complete":
            times.append(time.monotonic() - written)
        else:  # what held it: a false rollback's check, or what waited for traffic
            reasons.append(f"revision {row['revision']} {row['state']}: {row['reason']}")
    return {"changes": count, "outcomes": dict(outcomes),
            "false_rollbacks": outcomes["rolled_back"], "not_complete": reasons,
            "write_to_last_region": _summary(sorted(times)) if times else None}  # fmt: skip


async def _revocations(admin: httpx.AsyncClient, http: httpx.AsyncClient,
                       gateways: dict[str, str], rounds: int) -> dict[str, Any]:  # fmt: skip
    await _write(admin, {"routing_policies": [_policy({}, SLO_TTFT_MS + 7)]})
    await asyncio.sleep(1)
    (await admin.post("/v1/rollouts/current/pause")).raise_for_status()
    times: list[float] = []
    for _ in range(rounds):
        made = (await admin.post("/v1/api-keys", json={"tenant": "bench"})).json()
        await asyncio.gather(*(_until(http, g, made["key"], 200) for g in gateways.values()))
        started = time.monotonic()
        path = f"/v1/api-keys/{made['name']}"
        revoked = asyncio.create_task(
            admin.patch(path, json={"revoked": True}, headers={"If-Match": "*"})
        )
        failed = await asyncio.gather(*(_until(http, g, made["key"], 401)
                                        for g in gateways.values()))  # fmt: skip
        (await revoked).raise_for_status()
        times.extend(at - started for at in failed)
    state = (await admin.get("/v1/rollouts")).json()["rollout"]["state"]
    (await admin.post("/v1/rollouts/current/abort")).raise_for_status()
    return {"rounds": rounds, "rollout_state_meanwhile": state, **_summary(sorted(times))}
