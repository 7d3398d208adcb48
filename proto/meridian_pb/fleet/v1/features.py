"""A tiered route's difficulty table and the features it weighs: part of the wire contract (a
route's weights name them, the control plane validates them, the agents compute them), so
written once for both sides. The agents' classifier (agents/router/tiers.py) computes each
feature; the table turns them into a tier.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

FEATURES = (
    "prompt_tokens_log2",
    "max_tokens_log2",
    "turns",
    "tools",
    "json",
    "code",
    "math",
    "reasoning",
)


@dataclass(frozen=True)
class Table:
    """Weights and cut points; `thresholds` has one fewer entry than the route's tiers."""

    bias: float
    weights: Mapping[str, float]
    thresholds: tuple[float, ...]

    def tier(self, features: Mapping[str, float]) -> tuple[int, float]:
        """The tier (0: cheapest) and the score that chose it."""
        score = self.bias + sum(w * features.get(f, 0.0) for f, w in self.weights.items())
        return self.tier_of(score), score

    def tier_of(self, score: float) -> int:
        return bisect_right(self.thresholds, score)


DEFAULT_WEIGHTS = MappingProxyType(
    {
        "prompt_tokens_log2": 0.25,
        "max_tokens_log2": 0.05,
        "turns": 0.05,
        "tools": 1.5,
        "json": 0.75,
        "code": 3.0,
        "math": 3.0,
        "reasoning": 3.0,
    }
)
DEFAULT_BIAS = -3.0
DEFAULT_STEP = 1.5  # between the default thresholds of a route of more than two tiers


def default_table(tiers: int) -> Table:
    """The built-in table: a short plain question is cheap; code, math, asked-for reasoning,
    tools or a prompt of thousands of tokens go up."""
    return Table(DEFAULT_BIAS, DEFAULT_WEIGHTS, tuple(DEFAULT_STEP * i for i in range(tiers - 1)))
