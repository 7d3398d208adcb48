"""An engine's Prometheus metrics, as much of them as the agent's telemetry needs.

SGLang and the simulator publish the same `sglang:` names; counters and histogram buckets
are summed over label sets (DP ranks, TP ranks) so that one engine reads as one.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

TTFT = "sglang:time_to_first_token_seconds"
ITL = "sglang:inter_token_latency_seconds"


@dataclass
class Counters:
    prompt_tokens: float = 0.0
    cached_tokens: float = 0.0
    requests: float = 0.0
    ttft: dict[float, float] = field(default_factory=dict)  # upper bound -> cumulative count
    itl: dict[float, float] = field(default_factory=dict)
    generation_tokens: float = 0.0

    def minus(self, before: Counters) -> Counters:
        """What happened since `before`; all of it if the engine restarted in between."""
        if (
            self.requests < before.requests
            or self.prompt_tokens < before.prompt_tokens
            or self.generation_tokens < before.generation_tokens
        ):
            return self
        return Counters(
            self.prompt_tokens - before.prompt_tokens,
            self.cached_tokens - before.cached_tokens,
            self.requests - before.requests,
            {le: n - before.ttft.get(le, 0.0) for le, n in self.ttft.items()},
            {le: n - before.itl.get(le, 0.0) for le, n in self.itl.items()},
            self.generation_tokens - before.generation_tokens,
        )

    def plus(self, other: Counters) -> Counters:
        return Counters(
            self.prompt_tokens + other.prompt_tokens,
            self.cached_tokens + other.cached_tokens,
            self.requests + other.requests,
            _add(self.ttft, other.ttft),
            _add(self.itl, other.itl),
            self.generation_tokens + other.generation_tokens,
        )


def _add(a: dict[float, float], b: dict[float, float]) -> dict[float, float]:
    out = dict(a)
    for le, n in b.items():
        out[le] = out.get(le, 0.0) + n
    return out


def parse(text: str) -> Counters:
    scalars: dict[str, float] = defaultdict(float)
    buckets: dict[str, dict[float, float]] = {TTFT: defaultdict(float), ITL: defaultdict(float)}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_bucket") and family.name in buckets:
                buckets[family.name][float(sample.labels["le"])] += sample.value
            elif sample.name.endswith("_total"):
                scalars[sample.name] += sample.value
    return Counters(
        prompt_tokens=scalars["sglang:prompt_tokens_total"],
        cached_tokens=scalars["sglang:cached_tokens_total"],
        requests=scalars["sglang:num_requests_total"],
        ttft=dict(buckets[TTFT]),
        itl=dict(buckets[ITL]),
        generation_tokens=scalars["sglang:generation_tokens_total"],
    )


def quantile(buckets: dict[float, float], q: float) -> float:
    """As PromQL's histogram_quantile: linear within the bucket that holds the rank."""
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return 0.0
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in ordered:
        if count >= rank:
            if upper == float("inf"):
                return lower
            share = (rank - below) / (count - below) if count > below else 1.0
            return lower + (upper - lower) * share
        lower, below = upper, count
    return lower
