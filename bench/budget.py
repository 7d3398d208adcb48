"""`meridian bench ledger`'s budget part: a spend budget under concurrency, Meridian's against a
check-then-increment limiter as LiteLLM keeps one, on the same workload in the same run.

Three regions (static parts 5:1:2, by GPUs) are asked by `clients` clients at once, skewed
against the static parts (20% : 50% : 30%). Each request has a prompt and a max_tokens,
answers a random part of it, and takes time by its length; a refused client waits a little
and asks again. Both limiters run in this process, on the wall clock:

- **Meridian**: each region's agent is agents/gateway/budgets.py (reserve the most a request
  may cost, settle on its cost, within the node's ceiling; out of it while the fleet has
  room, wait up to 2 s for a lease); every second it reports, and the
  leader's plan (controlplane/services/quotas/spend.py) moves the ceilings, whose leases
  reach the agents 0.2 to 1 s later.
- **Check-then-increment**: each region's replica admits while the spend it knows is below
  the limit, and adds a request's cost when it ends; the replicas share their spend every
  `sync_s` (LiteLLM's in-memory spend, synced through Redis or its database).

Overspend is the spend past the limit, in requests of the most cost; a refusal is false when
what the fleet had spent and will spend on the requests under way was below 95% of the limit.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.budgets import NANOS, Budget, BudgetRule

from agents.config import Tenant
from agents.gateway.budgets import Budgets
from agents.gateway.errors import BudgetExceeded
from controlplane.services.quotas.spend import Agent, plan_budget

PARTS = (5 / 8, 1 / 8, 2 / 8)  # the regions' static parts, by GPUs
ASKED = (0.2, 0.5, 0.3)  # where the clients ask
PRICE_IN, PRICE_OUT = 3_000, 15_000  # nanos a token ($3 and $15 a million)
LEADER_S = 1.0  # the leader's period, and the agents' reports
RETRY_S = 0.2


@dataclass
class Books:
    """What the fleet truly spent and has under way, and the refusals."""

    limit: int
    spent: int = 0
    under_way: int = 0  # the true cost of the requests admitted and not ended
    refused: int = 0
    false_refusals: int = 0
    served: int = 0
    most: int = 0  # a request's most cost, the largest seen

    async def refuse(self) -> None:
        """A refusal, counted; its client waits a little before it asks again."""
        self.refused += 1
        if self.spent + self.under_way < 0.95 * self.limit:
            self.false_refusals += 1
        await asyncio.sleep(RETRY_S)

    async def serve(self, cost: int, seconds: float) -> None:
        """An admitted request, under way for `seconds`, then spent."""
        self.under_way += cost
        await asyncio.sleep(seconds)
        self.under_way -= cost
        self.spent += cost
        self.served += 1

    def figures(self) -> dict[str, Any]:
        over = max(0, self.spent - self.limit)
        return {"served": self.served, "spent_of_limit": round(self.spent / self.limit, 4),
                "overspend_requests": round(over / self.most, 2) if self.most else 0.0,
                "refused": self.refused, "false_refusals": self.false_refusals}  # fmt: skip


@dataclass
class Workload:
    seed: int
    clients: int
    seconds: float
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def request(self) -> tuple[int, int, int, float, int]:
        """(region, most cost, cost, seconds, max_tokens)."""
        rng = self.rng
        region = rng.choices(range(3), ASKED)[0]
        prompt, max_tokens = rng.randrange(200, 2000), rng.randrange(128, 1024)
        out = rng.randrange(max_tokens // 10, max_tokens + 1)
        most = prompt * PRICE_IN + max_tokens * PRICE_OUT
        return region, most, prompt * PRICE_IN + out * PRICE_OUT, 0.1 + out * 0.002, max_tokens


async def _clients(workload: Workload, ask: Any, books: Books) -> None:
    """`clients` loops, each asking again as its last ends, until `seconds` are up."""
    ends = time.monotonic() + workload.seconds

    async def client() -> None:
        while time.monotonic() < ends:
            region, most, cost, seconds, _ = workload.request()
            books.most = max(books.most, most)
            await ask(region, most, cost, seconds)

    await asyncio.gather(*(client() for _ in range(workload.clients)))


async def meridian(workload: Workload, limit: int) -> dict[str, Any]:
    books = Books(limit)
    budget = Budget(name="b", period="month", limit=limit / NANOS)
    agents = [Budgets() for _ in PARTS]
    for agent in agents:
        agent.heard_until = float("inf")  # the leader below is never away
    tenants = [Tenant("t", "standard", None, None, None, budgets=(
        BudgetRule("b", "month", "UTC", limit, 80.0, None, int(limit * part)),))
        for part in PARTS]  # fmt: skip
    loop = asyncio.get_running_loop()

    async def ask(region: int, most: int, cost: int, seconds: float) -> None:
        await agents[region].room(tenants[region], "k", most)  # as the gateway: a lease, maybe
        try:
            hold = agents[region].reserve(tenants[region], "k", most)
        except BudgetExceeded:
            await books.refuse()
            return
        await books.serve(cost, seconds)
        agents[region].settle(hold, cost)

    async def leader() -> None:
        doc: dict[str, Any] | None = None
        rng = random.Random(workload.seed + 1)
        while True:
            await asyncio.sleep(LEADER_S)
            told = []
            for n, agent in enumerate(agents):
                (use,) = agent.report(tenants[n])
                agent.reported()
                told.append(Agent(str(n), int(limit * PARTS[n]), {
                    "window": use.window, "used": use.used_nanos, "held": use.held_nanos,
                    "ceiling": use.ceiling_nanos, "seq": use.lease_seq,
                    "wants": use.spent_per_minute + use.refused_per_minute}))  # fmt: skip
            doc = plan_budget(budget, told, doc, time.time())
            for node, lease in doc["leases"].items():
                if not lease["seq"]:
                    continue
                n = int(node)
                message = _lease(doc, lease)
                loop.call_later(rng.uniform(0.2, 1.0), agents[n].take, tenants[n], [message])

    task = asyncio.create_task(leader())
    try:
        await _clients(workload, ask, books)
    finally:
        task.cancel()
    return books.figures()


def _lease(doc: dict[str, Any], lease: dict[str, Any]) -> pb.SpendLease:
    return pb.SpendLease(budget="b", window=doc["window"], limit_nanos=doc["limit"],
                         ceiling_nanos=lease["ceiling"], seq=lease["seq"],
                         fleet_used_nanos=lease.get("fleet", 0))  # fmt: skip


async def check_then_increment(workload: Workload, limit: int, sync_s: float) -> dict[str, Any]:
    books = Books(limit)
    shared = [0]  # what the replicas have told each other
    known = [0, 0, 0]  # what each replica knows the fleet spent
    pending = [0, 0, 0]  # what each spent since it last told

    async def ask(region: int, most: int, cost: int, seconds: float) -> None:
        if known[region] >= limit:
            await books.refuse()
            return
        await books.serve(cost, seconds)
        known[region] += cost
        pending[region] += cost

    async def sync() -> None:
        while True:
            await asyncio.sleep(sync_s)
            for n in range(3):
                shared[0] += pending[n]
                pending[n] = 0
            for n in range(3):
                known[n] = shared[0]

    task = asyncio.create_task(sync())
    try:
        await _clients(workload, ask, books)
    finally:
        task.cancel()
    return books.figures()


async def run(clients: int = 200, seconds: float = 20.0, seed: int = 44) -> dict[str, Any]:
    """Both limiters on the same workload; the budget is what the clients would spend in
    about half the time."""
    probe = Workload(seed, clients, seconds)
    costs = [probe.request() for _ in range(2000)]
    mean_cost = sum(c[2] for c in costs) / len(costs)
    mean_s = sum(c[3] for c in costs) / len(costs)
    limit = int(clients / mean_s * seconds / 2 * mean_cost) // 1000 * 1000  # whole micros
    out: dict[str, Any] = {"clients": clients, "seconds": seconds, "limit": limit / NANOS}
    out["meridian"] = await meridian(Workload(seed, clients, seconds), limit)
    for sync_s in (1.0, 10.0):
        out[f"check_then_increment_sync_{sync_s:g}s"] = await check_then_increment(
            Workload(seed, clients, seconds), limit, sync_s
        )
    return out
