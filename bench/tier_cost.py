"""What a tiered route's choice costs a request, in this process: the classifier, the
conversation's key, the body re-encoded with the tier's name (bench/tiers.py reports it, and
so does the overhead benchmark)."""

from __future__ import annotations

import statistics
import time
from typing import Any

import orjson
from meridian_pb.fleet.v1.features import default_table

from agents.config import ModelConfig, Tenant, TieredRouteConfig
from agents.gateway.requests import parse
from agents.gateway.tiers import Tiers
from bench.harness import REGION
from bench.load import Req

SMALL, LARGE, ROUTE = "small", "large", "chat-auto"


async def classifier_cost(reqs: list[Req], number: int = 3) -> dict[str, Any]:
    """The tier's choice per request (the features, the table, the conversation's key) and the
    body re-encoded with the tier's name, in µs of this process: p50 and p99 over the
    workload, best of `number` passes."""
    models = {m: ModelConfig(m, 131072, frozenset({"chat", "completion"})) for m in (SMALL, LARGE)}
    route = TieredRouteConfig(ROUTE, (SMALL, LARGE), default_table(2))
    config: Any = type("Config", (), {"models": models, "tiered": {ROUTE: route}, "adapters": {},
                                      "region": REGION})()  # fmt: skip
    tenant = Tenant("bench", "standard", None, None, None, tiering=True)
    tiers = Tiers()
    parsed = []
    for req in reqs:
        raw = orjson.dumps({"model": ROUTE, "messages": req.messages, "max_tokens": req.max_tokens})
        inference, _ = parse("/v1/chat/completions", raw, config, "bench")
        parsed.append(inference)

    async def choose_all() -> list[float]:
        out = []
        for inference in parsed:
            began = time.perf_counter_ns()
            choice = await tiers.choose(route, tenant, False, inference, len(inference.key) // 4,
                                        models, "sk-hash")  # fmt: skip
            assert inference.doc is not None
            orjson.dumps(inference.doc | {"model": choice.model})
            out.append((time.perf_counter_ns() - began) / 1000)
        return out

    runs = [await choose_all() for _ in range(number)]
    best = min(runs, key=statistics.median)
    best.sort()
    return {
        "requests": len(best),
        "p50_us": round(best[len(best) // 2], 1),
        "p99_us": round(best[min(len(best) - 1, int(len(best) * 0.99))], 1),
        "max_us": round(best[-1], 1),
    }
