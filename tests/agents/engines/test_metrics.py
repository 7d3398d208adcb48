"""The agent reads an engine's own metrics: from a real simulator's /metrics."""

from __future__ import annotations

from agents.engines.metrics import Counters, parse, quantile
from tests.kits.sim import running_sim


async def test_counters_read_from_a_simulator() -> None:
    body = {"text": "the same prompt twice over", "sampling_params": {"max_new_tokens": 4}}
    async with running_sim("--enable-metrics") as sim, sim.client() as client:
        before = parse((await client.get("/metrics")).text)
        for _ in range(2):
            await client.post("/generate", json=body)
        after = parse((await client.get("/metrics")).text)
    served = after.minus(before)
    assert served.requests == 2
    assert served.prompt_tokens == 10
    assert served.cached_tokens == 4  # the second time, all but the last token (as SGLang)
    assert served.ttft[float("inf")] == 2
    assert served.itl[float("inf")] == 2
    assert 0 < quantile(served.ttft, 0.5) < 1


def test_quantiles_interpolate_within_buckets() -> None:
    buckets = {0.1: 5.0, 0.2: 10.0, float("inf"): 10.0}
    assert quantile(buckets, 0.5) == 0.1
    assert quantile(buckets, 0.75) == 0.15000000000000002
    assert quantile({}, 0.5) == 0.0
    assert quantile({0.1: 0.0, float("inf"): 0.0}, 0.9) == 0.0


def test_a_restarted_engine_counts_from_zero() -> None:
    before = Counters(prompt_tokens=100, cached_tokens=50, requests=10)
    after = Counters(prompt_tokens=20, cached_tokens=0, requests=2)
    assert after.minus(before) == after
