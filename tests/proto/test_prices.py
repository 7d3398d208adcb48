"""Prices: validated as the admin API takes them, found by time, applied to usage with the
class's multiplier and the tenant's discount; the past is never rewritten."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from meridian_pb.fleet.v1.prices import PriceList, Pricing, past_kept, wire
from pydantic import ValidationError

T0 = datetime(2026, 11, 1, tzinfo=UTC)
T1 = datetime(2026, 12, 1, tzinfo=UTC)


def _pricing(**more: object) -> Pricing:
    return Pricing.model_validate({
        "prices": [
            {"effective_from": T0, "input": 0.15, "cached_input": 0.075, "output": 0.6},
            {"effective_from": T1, "input": 0.3, "output": 1.2},
        ],
        **more,
    })  # fmt: skip


def _list(pricing: Pricing) -> PriceList:
    doc = wire(pricing)
    prices = [(p["from_s"], p["input_micros"], p["cached_input_micros"], p["output_micros"])
              for p in doc["prices"]]  # fmt: skip
    return PriceList(prices, doc["class_multipliers"])


def test_usage_is_priced_at_the_price_in_effect_when_it_started() -> None:
    prices = _list(_pricing(class_multipliers={"batch": 0.5}))
    before, during, after = T0.timestamp() - 1, T1.timestamp() - 1, T1.timestamp()
    assert prices.cost_nanos(before, 1000, 0, 100, "standard") is None  # no price yet
    # 600 uncached at 150 nanos, 400 cached at 75, 100 out at 600
    assert prices.cost_nanos(during, 1000, 400, 100, "standard") == 90_000 + 30_000 + 60_000
    # the new price: cached input, not given, is input's
    assert prices.cost_nanos(after, 1000, 400, 100, "standard") == 300_000 + 120_000
    assert prices.cost_nanos(after, 1000, 400, 100, "batch") == 210_000
    assert prices.cost_nanos(after, 1000, 400, 100, "batch", discount=0.1) == 189_000


def test_prices_out_of_order_too_precise_or_of_no_class_are_refused() -> None:
    bad: dict[str, Any]
    for bad in (
        {"prices": [{"effective_from": T1, "input": 1, "output": 1},
                    {"effective_from": T0, "input": 1, "output": 1}]},
        {"prices": [{"effective_from": T0, "input": 0.0000001, "output": 1}]},
        {"prices": [{"effective_from": T0, "input": -1, "output": 1}]},
        {"prices": [{"effective_from": "2026-11-01T00:00:00", "input": 1, "output": 1}]},
        {"prices": []},
        {"prices": [{"effective_from": T0, "input": 1, "output": 1}],
         "class_multipliers": {"gold": 2}},
    ):  # fmt: skip
        with pytest.raises(ValidationError):
            Pricing.model_validate(bad)


def test_a_price_in_effect_stays_and_a_new_one_starts_later() -> None:
    now = T0 + timedelta(days=3)
    old = _pricing()
    future = now + timedelta(hours=1)
    added = old.model_copy(update={"prices": [*old.prices[:1], old.prices[1].model_copy(
        update={"effective_from": future})]})  # fmt: skip
    assert past_kept(old, added, now) is None  # a future price moved: fine
    changed = old.model_copy(update={"prices": [
        old.prices[0].model_copy(update={"input": 0.2}), old.prices[1]]})  # fmt: skip
    assert "cannot be changed or removed" in str(past_kept(old, changed, now))
    assert "cannot be changed or removed" in str(past_kept(old, None, now))
    backdated = old.model_copy(update={"prices": [
        old.prices[0], old.prices[0].model_copy(update={"effective_from": now})]})  # fmt: skip
    assert "must start after now" in str(past_kept(old, backdated, now))
    assert past_kept(None, old, now) is not None  # a new list may not begin in the past
