"""A node's part of its tenants' spend budgets (agents/gateway/budgets.py): a request reserves
the most it may cost and settles on what it cost; past the node's ceiling, 429
budget_exceeded; a window rolls over at midnight in the budget's zone; a lease never takes
back what was spent; what was spent survives a restart."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.budgets import NANOS, BudgetRule

from agents.config import Tenant
from agents.gateway.budgets import Budgets
from agents.gateway.errors import BudgetExceeded
from agents.gateway.quotas import Quotas

DOLLAR = NANOS


class Wall:
    def __init__(self, at: datetime) -> None:
        self.now = at.timestamp()

    def __call__(self) -> float:
        return self.now


def _tenant(*rules: BudgetRule) -> Tenant:
    return Tenant("acme", "standard", None, None, None, budgets=rules)


def _daily(limit: float = 10.0, part: float = 1.0, key: str | None = None) -> BudgetRule:
    return BudgetRule("daily", "day", "America/New_York", int(limit * DOLLAR), 80.0, key,
                      int(limit * part * DOLLAR))  # fmt: skip


def test_requests_reserve_their_most_and_settle_on_their_cost() -> None:
    wall = Wall(datetime(2026, 11, 28, 15, tzinfo=UTC))
    budgets, acme = Budgets(wall), _tenant(_daily(10.0))
    holds = [budgets.reserve(acme, "k1", 3 * DOLLAR) for _ in range(3)]  # 9 of 10 held
    with pytest.raises(BudgetExceeded) as refused:
        budgets.reserve(acme, "k1", 2 * DOLLAR)
    assert refused.value.status == 429
    assert refused.value.code == "budget_exceeded"
    assert (refused.value.headers or {})["x-ratelimit-limit-budget"] == "10.000000"
    assert refused.value.retry_after_s == 2  # the fleet may have room: leases move in seconds
    for hold in holds:
        budgets.settle(hold, DOLLAR)  # each cost 1 of the 3 it held
    assert budgets.headers(acme, "k1")["x-ratelimit-remaining-budget"] == "7.000000"
    assert budgets.reserve(acme, "k1", 7 * DOLLAR) is not None  # exactly the rest
    with pytest.raises(BudgetExceeded):
        budgets.reserve(acme, "k1", 1)
    budgets.settle(holds[0], 5 * DOLLAR)  # settled once only
    assert budgets.status()["acme"]["daily"]["used"] == 3.0


def test_a_keys_budget_holds_that_key_alone() -> None:
    budgets = Budgets(Wall(datetime(2026, 11, 28, 15, tzinfo=UTC)))
    acme = _tenant(_daily(1.0, key="k1"))
    budgets.reserve(acme, "k1", DOLLAR)
    with pytest.raises(BudgetExceeded) as refused:
        budgets.reserve(acme, "k1", 1)
    assert "API key k1" in refused.value.message
    assert budgets.reserve(acme, "k2", 100 * DOLLAR) is None  # no budget of its own


def test_the_window_rolls_over_at_midnight_in_its_zone() -> None:
    """New York is UTC-5 in November: its day ends at 05:00 UTC."""
    wall = Wall(datetime(2026, 11, 29, 4, 59, 59, tzinfo=UTC))
    budgets, acme = Budgets(wall), _tenant(_daily(1.0))
    budgets.settle(budgets.reserve(acme, "k", DOLLAR), DOLLAR)
    with pytest.raises(BudgetExceeded) as refused:
        budgets.reserve(acme, "k", 1)
    assert refused.value.retry_after_s == 1  # nothing left anywhere: until the window ends
    wall.now += 2
    hold = budgets.reserve(acme, "k", DOLLAR)
    assert hold is not None
    assert hold.spends[0].window == "2026-11-29"
    assert budgets.report(acme)[0].window == "2026-11-29"


def test_a_lease_never_takes_back_what_was_spent_and_is_for_its_window_alone() -> None:
    wall = Wall(datetime(2026, 11, 28, 15, tzinfo=UTC))
    budgets, acme = Budgets(wall), _tenant(_daily(10.0, part=0.5))  # static part: 5
    budgets.settle(budgets.reserve(acme, "k", 4 * DOLLAR), 4 * DOLLAR)

    def lease(ceiling: float, seq: int, window: str = "2026-11-28") -> pb.SpendLease:
        return pb.SpendLease(budget="daily", window=window, limit_nanos=10 * DOLLAR,
                             ceiling_nanos=int(ceiling * DOLLAR), seq=seq,
                             fleet_used_nanos=6 * DOLLAR)  # fmt: skip

    budgets.take(acme, [lease(1.0, 1)])  # lowered below what it spent: to what it spent
    (use,) = budgets.report(acme)
    assert (use.ceiling_nanos, use.lease_seq, use.used_nanos) == (4 * DOLLAR, 1, 4 * DOLLAR)
    with pytest.raises(BudgetExceeded):
        budgets.reserve(acme, "k", 1)
    budgets.take(acme, [lease(9.0, 3), lease(2.0, 2)])  # an older lease coming late: not taken
    budgets.take(acme, [lease(20.0, 4, window="2026-11-27")])  # another window's: not taken
    assert budgets.report(acme)[0].ceiling_nanos == 9 * DOLLAR
    # the fleet had used 6 (this node's 4 among them) when the lease was made
    assert budgets.headers(acme, "k")["x-ratelimit-remaining-budget"] == "4.000000"


def test_what_was_spent_survives_a_restart(tmp_path: Path) -> None:
    wall = Wall(datetime(2026, 11, 28, 15, tzinfo=UTC))
    path = tmp_path / "budgets.json"
    budgets, acme = Budgets(wall), _tenant(_daily(10.0))
    budgets.open(path)
    budgets.settle(budgets.reserve(acme, "k", 6 * DOLLAR), 6 * DOLLAR)
    budgets.reserve(acme, "k", 3 * DOLLAR)  # under way when the agent is killed
    budgets.reported()
    again = Budgets(wall)
    again.open(path)
    with pytest.raises(BudgetExceeded):  # 9 of 10 spent, as far as it knows
        again.reserve(acme, "k", 2 * DOLLAR)
    wall.now += 86_400  # the next day
    assert again.reserve(acme, "k", 10 * DOLLAR) is not None


def test_a_monthly_window_rolls_over_at_midnight_in_its_zone() -> None:
    """Asia/Kolkata is UTC+5:30: its December begins at 18:30 UTC on November 30."""
    wall = Wall(datetime(2026, 11, 30, 18, 29, 59, tzinfo=UTC))
    monthly = BudgetRule("monthly", "month", "Asia/Kolkata", DOLLAR, 80.0, None, DOLLAR)
    budgets, acme = Budgets(wall), _tenant(monthly)
    budgets.settle(budgets.reserve(acme, "k", DOLLAR), DOLLAR)
    with pytest.raises(BudgetExceeded) as refused:
        budgets.reserve(acme, "k", 1)
    assert refused.value.retry_after_s == 1
    assert budgets.report(acme)[0].window == "2026-11-01"
    wall.now += 2
    assert budgets.reserve(acme, "k", DOLLAR) is not None
    assert budgets.report(acme)[0].window == "2026-12-01"
    headers = budgets.headers(acme, "k")
    assert headers["x-ratelimit-remaining-budget"] == "0.000000"
    # December has 31 days: the window resets at its end, as OpenAI writes a reset
    assert headers["x-ratelimit-reset-budget"].startswith(f"{31 * 24 * 60 - 1}m")


def test_a_batch_line_is_held_in_its_budgets_and_not_its_quota() -> None:
    quotas = Quotas()
    quotas.budgets = Budgets(Wall(datetime(2026, 11, 28, 15, tzinfo=UTC)))
    acme = replace(_tenant(_daily(10.0)), requests_per_minute=1)
    lines = [quotas.admit(acme, 10, "k1", 4 * DOLLAR, budgets_only=True) for _ in range(2)]
    assert all(line.hold is not None for line in lines)  # its quota is not asked: 1 a minute
    with pytest.raises(BudgetExceeded):  # 8 of 10 held: a third line is refused
        quotas.admit(acme, 10, "k1", 4 * DOLLAR, budgets_only=True)
    assert quotas.demand.tally("acme").concurrent == 0  # nor held in its concurrency


async def test_out_of_its_part_a_node_waits_for_a_lease_while_the_fleet_has_room() -> None:
    wall = Wall(datetime(2026, 11, 28, 15, tzinfo=UTC))
    budgets, acme = Budgets(wall), _tenant(_daily(10.0, part=0.5))  # static part: 5

    def lease(ceiling: float, seq: int, fleet_used: float) -> pb.SpendLease:
        return pb.SpendLease(budget="daily", window="2026-11-28", limit_nanos=10 * DOLLAR,
                             ceiling_nanos=int(ceiling * DOLLAR), seq=seq,
                             fleet_used_nanos=int(fleet_used * DOLLAR))  # fmt: skip

    budgets.take(acme, [lease(5.0, 1, 0.0)])
    budgets.heard_until = time.monotonic() + 60  # the leader is heard from
    budgets.settle(budgets.reserve(acme, "k", 5 * DOLLAR), 5 * DOLLAR)  # its part, spent
    waiting = asyncio.ensure_future(budgets.room(acme, "k", 2 * DOLLAR, within_s=30))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # the fleet had 5 left: a lease may come
    assert budgets.report(acme)[0].refused_per_minute > 0  # its want, told to the leader
    budgets.take(acme, [lease(8.0, 2, 5.0)])
    await asyncio.wait_for(waiting, 1)
    assert budgets.reserve(acme, "k", 2 * DOLLAR) is not None  # not refused: the lease's room
    # the fleet has 3 left as the last lease said, and this node holds 2 that may cost
    # less: a request for 6 cannot fit however the leases move, and is refused at once
    await asyncio.wait_for(budgets.room(acme, "k", 6 * DOLLAR, within_s=30), 1)
    with pytest.raises(BudgetExceeded):
        budgets.reserve(acme, "k", 6 * DOLLAR)
    # it waits no longer than it was told
    await asyncio.wait_for(budgets.room(acme, "k", 1 * DOLLAR, within_s=0.1), 1)
    # and with the leader away (no leases within their ttl), not at all
    budgets.heard_until = time.monotonic() - 1
    await asyncio.wait_for(budgets.room(acme, "k", 1 * DOLLAR, within_s=30), 0.5)
