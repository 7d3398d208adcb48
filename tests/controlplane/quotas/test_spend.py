"""A spend budget's window split over agents by the leader (controlplane/services/quotas/spend.py):
whatever the agents do and however late leases reach them, the ceilings they spend within
never sum above the limit; what is left moves to the agents that want it."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from meridian_pb.fleet.v1.budgets import NANOS, Budget

from controlplane.services.quotas.spend import Agent, plan_budget

AT = datetime(2026, 11, 28, 12, tzinfo=UTC).timestamp()
BUDGET = Budget(name="monthly", period="month", time_zone="Europe/Paris", limit=100.0)
LIMIT = 100 * NANOS


@dataclass
class Node:
    """An agent as agents/gateway/budgets.py keeps one budget's window."""

    name: str
    static: int
    ceiling: int | None = None
    seq: int = 0
    used: int = 0
    held: int = 0
    wants: float = 0.0

    @property
    def spends_within(self) -> int:
        return self.static if self.ceiling is None else self.ceiling

    def take(self, lease: dict[str, int]) -> None:
        if lease["seq"] > self.seq:
            self.ceiling = max(lease["ceiling"], self.used + self.held)
            self.seq = lease["seq"]

    def ask(self, cost: int) -> bool:
        if self.used + self.held + cost > self.spends_within:
            self.wants += cost
            return False
        self.used += cost
        self.wants += cost
        return True

    def report(self, window: str) -> dict[str, Any]:
        told = {"window": window, "used": self.used, "held": self.held,
                "ceiling": self.spends_within, "seq": self.seq if self.ceiling else 0,
                "wants": self.wants}  # fmt: skip
        self.wants = 0.0
        return told


def _run(seed: int, periods: int, demand: dict[str, float]) -> tuple[list[Node], list[int]]:
    """Agents spend by `demand` (requests a period, each up to 1% of the limit); each period
    the leader plans from their last reports, and its leases reach each agent one to three
    periods later, some never. Returns the agents and the sum of their ceilings each period."""
    rng = random.Random(seed)
    nodes = [Node(n, LIMIT // len(demand)) for n in demand]
    given: dict[str, Any] | None = None
    reports: dict[str, dict[str, Any] | None] = dict.fromkeys(demand)
    in_flight: list[tuple[int, str, dict[str, int]]] = []
    sums = []
    for period in range(periods):
        for node in nodes:
            for _ in range(rng.randrange(int(demand[node.name] * 2) + 1)):
                node.ask(rng.randrange(1, LIMIT // 100))
            if rng.random() < 0.8:  # some reports are lost or late
                reports[node.name] = node.report("2026-11-01")
        agents = [Agent(n.name, n.static, reports[n.name]) for n in nodes]
        given = plan_budget(BUDGET, agents, given, AT)
        for name, lease in given["leases"].items():
            if lease["seq"] and rng.random() < 0.9:
                in_flight.append((period + rng.randrange(1, 4), name, dict(lease)))
        for _due, name, lease in [f for f in in_flight if f[0] <= period]:
            next(n for n in nodes if n.name == name).take(lease)
        in_flight = [f for f in in_flight if f[0] > period]
        sums.append(sum(n.spends_within for n in nodes))
    return nodes, sums


def test_the_ceilings_never_sum_above_the_limit_whatever_comes_late() -> None:
    for seed in range(20):
        nodes, sums = _run(seed, 120, {"a": 20, "b": 3, "c": 0.5})
        assert max(sums) <= LIMIT, (seed, max(sums))
        assert sum(n.used for n in nodes) <= LIMIT


def test_what_is_left_goes_where_it_is_wanted() -> None:
    """One agent of three is asked for nearly everything: it spends far beyond its static
    third, and the fleet spends nearly the whole limit."""
    nodes, _ = _run(7, 200, {"busy": 30, "idle-1": 0, "idle-2": 0.2})
    busy = next(n for n in nodes if n.name == "busy")
    assert busy.used > 0.8 * LIMIT
    assert sum(n.used for n in nodes) > 0.95 * LIMIT


def test_a_new_window_or_limit_starts_from_the_static_parts() -> None:
    agents = [Agent("a", LIMIT // 2, {"window": "2026-11-01", "used": LIMIT // 2, "held": 0,
                                      "ceiling": LIMIT // 2, "seq": 0, "wants": 1e9}),
              Agent("b", LIMIT // 2, None)]  # fmt: skip
    doc = plan_budget(BUDGET, agents, None, AT)
    assert doc["window"] == "2026-11-01"
    assert doc["limit"] == LIMIT
    # b may spend its static half: a, which spent its own, cannot be raised
    assert doc["leases"]["a"]["seq"] == 0
    december = datetime(2026, 11, 30, 23, 30, tzinfo=UTC).timestamp()  # 00:30 in Paris
    later = plan_budget(BUDGET, agents, doc, december)
    assert later["window"] == "2026-12-01"
    assert later["used"] == 0  # a's report is of November's window
    assert later["soft"] is False
