"""Prices: what a request's usage costs. Both planes use this: the control plane validates a
model's prices and puts them in the snapshot (`wire`); the agents price each usage record
(`cost_nanos`) and, for budgets, what a request may cost at most.

A model's prices are a list, each from its `effective_from` on, per million tokens of input
(the prompt's uncached part), cached input and output, in the fleet's currency. A change
applies from its time on and never to what came before: a price in effect cannot be changed
or removed, and a new one must start in the future. A service class may have a multiplier
(batch at half price, say) and a tenant a discount in percent.

On the wire a price is in millionths of the currency per million tokens (integers); a cost in
billionths of the currency (`cost_nanos`): a token at $0.15 per million costs 150 of them.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from meridian_pb.fleet.v1.classes import BY_NAME

MAX_PRICE = 1_000_000.0  # per million tokens
MICROS = 1_000_000

Amount = Annotated[float, Field(ge=0, le=MAX_PRICE, allow_inf_nan=False)]


class Price(BaseModel):
    model_config = ConfigDict(extra="forbid")

    effective_from: AwareDatetime = Field(description="from this time on (with its offset)")
    input: Amount = Field(description="per million uncached prompt tokens")
    cached_input: Amount | None = Field(
        default=None, description="per million prompt tokens read from the cache; null: input"
    )
    output: Amount = Field(description="per million completion tokens")

    @field_validator("input", "cached_input", "output")
    @classmethod
    def _micros(cls, value: float | None) -> float | None:
        if value is not None and abs(round(value * MICROS) - value * MICROS) > 1e-6:
            raise ValueError("a price has at most six decimal places")
        return value


class Pricing(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prices: list[Price] = Field(min_length=1, max_length=64, description="oldest first")
    class_multipliers: dict[str, Annotated[float, Field(ge=0, le=100)]] = Field(
        default_factory=dict,
        max_length=len(BY_NAME),
        description="a service class's multiple of the price (a class not named: 1)",
    )

    @field_validator("class_multipliers")
    @classmethod
    def _classes(cls, multipliers: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(multipliers) - set(BY_NAME))
        if unknown:
            raise ValueError(f"no service class {unknown[0]!r} (one of {', '.join(BY_NAME)})")
        return multipliers

    @field_validator("prices")
    @classmethod
    def _ordered(cls, prices: list[Price]) -> list[Price]:
        times = [p.effective_from for p in prices]
        if any(b <= a for a, b in itertools.pairwise(times)):
            raise ValueError("prices must be in order of effective_from, each at its own time")
        return prices


def past_kept(before: Pricing | None, after: Pricing | None, now: datetime) -> str | None:
    """Why `after` may not replace `before` at `now`, or None: every price in effect by now
    is kept as it was, and every new one starts after now."""
    old = {p.effective_from: p for p in before.prices} if before is not None else {}
    new = {p.effective_from: p for p in after.prices} if after is not None else {}
    for at, price in old.items():
        if at <= now and new.get(at) != price:
            return (
                f"the price in effect from {at.isoformat()} applies to usage already "
                "recorded: it cannot be changed or removed (add one from a time to come)"
            )
    for at in new.keys() - old.keys():
        if at <= now:
            return f"a new price must start after now, not at {at.isoformat()}"
    return None


def wire(pricing: Pricing) -> dict[str, Any]:
    """The pricing as the snapshot's `Pricing` message's fields."""

    def micros(value: float) -> int:
        return round(value * MICROS)

    return {
        "prices": [
            {
                "from_s": int(p.effective_from.timestamp()),
                "input_micros": micros(p.input),
                "cached_input_micros": micros(
                    p.input if p.cached_input is None else p.cached_input
                ),
                "output_micros": micros(p.output),
            }
            for p in pricing.prices
        ],
        "class_multipliers": dict(pricing.class_multipliers),
    }


class PriceList:
    """A model's prices as the agent holds them: found by time, applied to usage."""

    __slots__ = ("_from", "_prices", "multipliers")

    def __init__(self, prices: Sequence[tuple[int, int, int, int]], multipliers: dict[str, float]):
        """`prices`: (from_s, input, cached input, output micros per million), by from_s."""
        self._prices = tuple(prices)
        self._from = [p[0] for p in self._prices]
        self.multipliers = multipliers

    def at(self, at_s: float) -> tuple[int, int, int, int] | None:
        """The price in effect at `at_s`; None before the first."""
        index = bisect.bisect_right(self._from, at_s) - 1
        return self._prices[index] if index >= 0 else None

    def cost_nanos(
        self,
        at_s: float,
        prompt: int,
        cached: int,
        completion: int,
        service_class: str,
        discount: float = 0.0,
    ) -> int | None:
        """What the usage costs at `at_s`, in billionths of the currency; None before the
        first price. `discount`: the tenant's, a fraction."""
        price = self.at(at_s)
        if price is None:
            return None
        cached = min(cached, prompt)
        micros = (prompt - cached) * price[1] + cached * price[2] + completion * price[3]
        factor = self.multipliers.get(service_class, 1.0) * (1.0 - discount)
        return round(micros * factor / 1000)  # micros per million tokens = nanos per 1000
