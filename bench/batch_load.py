"""Each region's load while a batch runs, sampled every `EVERY_S` (and reported at its
highest in each 10 s):

- from the agent: requests waiting in its admission (every class), refusals by code so far,
  breakers open, workers the quality guard holds, and the router's requests in flight and
  the slowest decode step it has learned;
- from its engines: running and queued requests by class (their own counts, by priority),
  the fullest KV pool, and retractions so far.

Read beside the interactive misses of the same 10 s, it shows where the region was full
when they came."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from meridian_pb.fleet.v1.classes import CLASSES, ServiceClass
from prometheus_client.parser import text_string_to_metric_families

from agents.engines.contract import engine_priority
from bench.harness import Sim

EVERY_S = 2.0
WAITING = "meridian_admission_waiting"
BREAKERS = "meridian_circuit_breaker_state"
HELD = "meridian_quality_held"
REFUSED = "meridian_admission_rejections"
RETRACTED = "sglang:num_retracted_requests"
ENGINE = {"sglang:num_running_reqs": "running", "sglang:num_queue_reqs": "queued"}
CLASS_OF = {str(engine_priority(ServiceClass(c))): ServiceClass(c).name.lower() for c in CLASSES}

Load = dict[str, float]  # "admission_waiting", "running:interactive", "queued:batch", ...


async def sample(
    urls: dict[str, str],
    operator: str,
    engines: dict[str, list[Sim]],
    since: float,
    until: asyncio.Task[Any],
) -> dict[str, list[tuple[float, Load]]]:
    """Region: [(seconds since `since`, what was seen)], until `until` ends."""
    out: dict[str, list[tuple[float, Load]]] = {name: [] for name in urls}
    async with httpx.AsyncClient(timeout=5) as http:
        while not until.done():
            await asyncio.wait({until}, timeout=EVERY_S)
            at = round(time.monotonic() - since, 1)
            for name, url in urls.items():
                try:
                    out[name].append((at, await _one(http, url, operator, engines[name])))
                except httpx.HTTPError:
                    continue  # a region being restarted: no sample this time
    return out


def by_10_s(samples: list[tuple[float, Load]]) -> dict[int, Load]:
    """The highest of each count in each 10 s."""
    out: dict[int, Load] = {}
    for at, seen in samples:
        bucket = out.setdefault(int(at // 10) * 10, {})
        for key, n in seen.items():
            bucket[key] = max(bucket.get(key, 0.0), n)
    return out


async def _one(http: httpx.AsyncClient, url: str, operator: str, sims: list[Sim]) -> Load:
    agent = await http.get(f"{url}/metrics", headers={"Authorization": f"Bearer {operator}"})
    seen: Load = {"admission_waiting": 0.0, "breakers_open": 0.0, "quality_held": 0.0}
    for family in text_string_to_metric_families(agent.text):
        if family.name == WAITING:
            seen["admission_waiting"] += sum(s.value for s in family.samples)
        elif family.name == BREAKERS:
            seen["breakers_open"] += sum(
                s.value for s in family.samples if s.labels.get("state") == "open"
            )
        elif family.name == HELD:
            seen["quality_held"] += sum(s.value for s in family.samples)
        elif family.name == REFUSED:  # a running total: the report takes each 10 s's share
            for s in family.samples:
                if s.name.endswith("_total"):
                    key = f"refused_so_far:{s.labels['code']}"
                    seen[key] = seen.get(key, 0.0) + s.value
    status = await http.get(f"{url}/agent/status", headers={"Authorization": f"Bearer {operator}"})
    workers = status.json()["router"]["workers"].values()
    seen["router_inflight"] = sum(w["inflight"] for w in workers)
    seen["router_decode_step_ms"] = max((w["decode_step_ms"] for w in workers), default=0.0)
    for sim in sims:
        text = (await http.get(f"{sim.url}/metrics")).text
        for family in text_string_to_metric_families(text):
            if family.name == RETRACTED:  # a running total, as the admission refusals
                seen["retracted_so_far"] = seen.get("retracted_so_far", 0.0) + sum(
                    s.value for s in family.samples if s.name.endswith("_total")
                )
            if family.name == "sglang:token_usage":
                usage = max(s.value for s in family.samples)
                seen["kv_usage_max"] = max(seen.get("kv_usage_max", 0.0), round(usage, 3))
            what = ENGINE.get(family.name)
            if what is None:
                continue
            for s in family.samples:
                service_class = CLASS_OF.get(s.labels.get("priority", ""))
                if service_class is not None:
                    key = f"{what}:{service_class}"
                    seen[key] = seen.get(key, 0.0) + s.value
    return seen
