"""Each tenant's spend budgets on this node: a request reserves the most it may cost (its prompt,
and its max_tokens at the output price) when admitted, and settles on what it cost at its end.
Past this node's ceiling for the budget's window, 429 `budget_exceeded`. No I/O on the path.

A node out of its part while the fleet, as its last lease said, still has room for the
request waits for the leader's next lease (or for its own requests to settle below what they
held), LEASE_WAIT_S at most, before it refuses: the want counts as refused in its next
report, which moves the lease its way. With the leader away (no leases message within their
ttl), it refuses at once. A request is then not refused for the region it came
to while another region's part sits unspent.

The ceiling is the node's static part of the limit (the region's part split over its nodes),
until the control plane's leader leases it more or less by demand (`SpendLease`,
controlplane/services/quotas/spend.py). A lease counts what the node has already spent: the
leader never takes back what was spent, and the node never lowers its ceiling below what it
spent and holds. A lease is good for its window however long the control plane is away: a
region spends within it and no further. The sum of the ceilings the leader counts is at most
the limit; the fleet's overspend is at most what requests cost beyond their reservation.

What this node spent in each window is written to disk (`save`, every report) and read back
at start, so that a restarted agent does not spend its window again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.budgets import NANOS, BudgetRule, window

from agents.config import RegionConfig, Tenant
from agents.gateway.errors import BudgetExceeded

if TYPE_CHECKING:
    from agents.gateway.flight import Flight

log = logging.getLogger(__name__)

RETRY_S = 2  # a node out of its part while the fleet has room: its lease grows within seconds
LEASE_WAIT_S = 2.0  # the longest a request waits for a lease that may give it room
# the most prompt tokens an engine counted beyond the gateway's estimate, fading by this much
# a request (a template's tokens are the same each time; a tokenizer's misses vary)
UNSEEN_FADE = 0.999
RATE_S = 30.0  # what a node spent and was refused, per minute, is averaged over about this long


@dataclass(slots=True)
class Spend:
    """One budget's window on this node."""

    window: str
    ends_s: float  # wall clock
    limit: int
    used: int = 0  # settled costs of the requests it admitted
    held: int = 0  # the most the requests under way may cost
    ceiling: int | None = None  # a lease's (None: the static part)
    seq: int = 0  # the lease's
    fleet_used: int = 0  # the fleet's used and held when the lease was made
    mine_then: int = 0  # this node's used and held when it took the lease
    spent: int = 0  # since the last report: what it wants
    refused: int = 0
    spent_rate: float = 0.0  # per minute, over the last RATE_S or so (what the leader reads)
    refused_rate: float = 0.0


@dataclass(slots=True)
class Hold:
    """A request's reservation in each budget that applies to it."""

    spends: tuple[Spend, ...]
    need: int
    settled: bool = False
    model: str = ""
    owner: Budgets | None = None

    def settle(self, cost: int | None, unseen: int = 0) -> None:
        """The request's end: what it cost (None: not known, its reservation is spent), and
        the prompt's tokens its engine counted beyond the gateway's estimate (a chat
        template's), which the next reservations of its model add."""
        if self.settled:
            return
        self.settled = True
        if self.owner is not None and self.model:
            extra = self.owner.unseen
            extra[self.model] = max(unseen, int(extra.get(self.model, 0) * UNSEEN_FADE))
        spent = self.need if cost is None else max(0, cost)
        for spend in self.spends:
            spend.held = max(0, spend.held - self.need)
            spend.used += spent
            spend.spent += spent
        if self.owner is not None and spent < self.need:
            self.owner.wake()  # what it did not cost is room again


class Budgets:
    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self.wall = wall
        self.path: Path | None = None  # where what was spent is kept (None: nowhere)
        self._spends: dict[tuple[str, str], Spend] = {}  # (tenant, budget)
        self.tenants: Mapping[str, Tenant] = {}  # the snapshot's, for the reports
        self.unseen: dict[str, int] = {}  # per model: see Hold.settle
        self._reported_at = wall()
        self._waiting: list[asyncio.Future[None]] = []  # requests waiting for room (`room`)
        # until when the leader is heard from (time.monotonic): its leases' last message and
        # their ttl; past it, nothing is waited for
        self.heard_until = 0.0

    def open(self, path: Path) -> None:
        """Kept at `path` from now on, with what was kept there before."""
        self._load(path)
        self.path = path

    def _spend(self, tenant: str, rule: BudgetRule, now: float) -> Spend:
        """The budget's window holding `now`: a new one at a window's end; a new limit starts
        the window's lease again (what was spent stays spent)."""
        spend = self._spends.get((tenant, rule.name))
        if spend is not None and now < spend.ends_s and spend.limit == rule.limit_nanos:
            return spend
        name, _, ends = window(rule.period, rule.zone, now)
        if spend is not None and spend.window == name:  # a new limit (requests under way
            spend.limit, spend.ceiling, spend.seq = rule.limit_nanos, None, 0  # hold this one)
            return spend
        # a request admitted in a window is counted in it, whenever it ends
        spend = self._spends[tenant, rule.name] = Spend(name, ends, rule.limit_nanos)
        return spend

    def reserve(self, tenant: Tenant, key: str, need: int, model: str = "") -> Hold | None:
        """Hold `need` (nanos) in each budget of the tenant that applies to the key, or raise
        BudgetExceeded; None where none applies."""
        if not tenant.budgets:
            return None
        now = self.wall()
        spends: list[Spend] = []
        for rule in tenant.budgets:
            if not rule.applies(key):
                continue
            spend = self._spend(tenant.name, rule, now)
            ceiling = spend.ceiling if spend.ceiling is not None else rule.static_nanos
            if spend.used + spend.held + need > ceiling:
                for counted in spends:
                    counted.refused += need
                spend.refused += need
                raise self._refused(tenant, rule, spend, need, now)
            spends.append(spend)
        for spend in spends:
            spend.held += need
        return Hold(tuple(spends), need, model=model, owner=self) if spends else None

    def settle(self, hold: Hold | None, cost: int | None) -> None:
        if hold is not None:
            hold.settle(cost)

    async def room(
        self, tenant: Tenant, key: str, need: int, within_s: float = LEASE_WAIT_S
    ) -> None:
        """Returns once `need` fits this node's part of every budget of the tenant that applies
        to the key, or the fleet has no room for it (`reserve` refuses it then), or after
        within_s: a node out of its part while the fleet has room waits for a lease."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        wanted = False
        while (short := self._short(tenant, key, need)) is not None:
            left = deadline - loop.time()
            if left <= 0:
                return
            if not wanted:  # told in the next report: the leader leases where it is wanted
                short.refused += need
                wanted = True
            woken = loop.create_future()
            self._waiting.append(woken)
            try:
                await asyncio.wait_for(woken, left)
            except TimeoutError:
                return
            finally:
                if woken in self._waiting:
                    self._waiting.remove(woken)

    def wake(self) -> None:
        """Room may have come: a lease, or a request that cost less than it held."""
        waiting, self._waiting = self._waiting, []
        for woken in waiting:
            if not woken.done():
                woken.set_result(None)

    def _short(self, tenant: Tenant, key: str, need: int) -> Spend | None:
        """The first budget whose part here is too small for `need` while the fleet, as far as
        this node knows, has room for it; None if none is."""
        now = self.wall()
        for rule in tenant.budgets:
            if not rule.applies(key):
                continue
            spend = self._spend(tenant.name, rule, now)
            ceiling = spend.ceiling if spend.ceiling is not None else rule.static_nanos
            if spend.used + spend.held + need <= ceiling:
                continue
            if time.monotonic() > self.heard_until:
                return None  # the leader is away: no lease is coming, refused at once
            if spend.ceiling is not None and self._remaining(rule, spend) + spend.held < need:
                return None  # no room in the fleet, as its last lease said: refused at once
            return spend  # room elsewhere, or no lease yet (a new window's comes in seconds)
        return None

    def _refused(
        self, tenant: Tenant, rule: BudgetRule, spend: Spend, need: int, now: float
    ) -> BudgetExceeded:
        # what the fleet has left, as far as this node knows, with what its own requests under
        # way hold (they may cost less): too little, and it is so until the window ends
        whole = self._remaining(rule, spend) + spend.held < need
        retry = max(1, math.ceil(spend.ends_s - now)) if whole else RETRY_S
        whose = f"API key {rule.api_key}" if rule.api_key else f"tenant {tenant.name}"
        error = BudgetExceeded(
            f"{whose} is at its {rule.period} budget {rule.name!r} "
            f"({rule.limit_nanos / NANOS:g} in window {spend.window})",
            retry_after_s=retry,
        )
        error.headers = self._headers(rule, spend, now)
        return error

    def _remaining(self, rule: BudgetRule, spend: Spend) -> int:
        mine = spend.used + spend.held
        if spend.ceiling is None:  # no lease yet: what the fleet spent is not known here
            return max(0, rule.static_nanos - mine)
        return max(0, rule.limit_nanos - spend.fleet_used - (mine - spend.mine_then))

    def _headers(self, rule: BudgetRule, spend: Spend, now: float) -> dict[str, str]:
        return {
            "x-ratelimit-limit-budget": f"{rule.limit_nanos / NANOS:.6f}",
            "x-ratelimit-remaining-budget": f"{self._remaining(rule, spend) / NANOS:.6f}",
            "x-ratelimit-reset-budget": duration(max(0.0, spend.ends_s - now)),
        }

    def headers(self, tenant: Tenant, key: str) -> dict[str, str]:
        """`x-ratelimit-*-budget` of the tightest budget that applies (the least remaining)."""
        best: dict[str, str] = {}
        least = None
        now = self.wall()
        for rule in tenant.budgets:
            if rule.applies(key):
                spend = self._spend(tenant.name, rule, now)
                left = self._remaining(rule, spend)
                if least is None or left < least:
                    least, best = left, self._headers(rule, spend, now)
        return best

    def take(self, tenant: Tenant, leases: list[pb.SpendLease]) -> None:
        """The leader's leases for the tenant's budgets: each for its window and limit only,
        never below what this node spent and holds."""
        now = self.wall()
        rules = {r.name: r for r in tenant.budgets}
        for lease in leases:
            rule = rules.get(lease.budget)
            if rule is None:
                continue
            spend = self._spend(tenant.name, rule, now)
            if lease.window != spend.window or lease.limit_nanos != spend.limit:
                continue  # for another window or limit: not this one's
            if lease.seq <= spend.seq:
                continue
            mine = spend.used + spend.held
            spend.ceiling, spend.seq = max(lease.ceiling_nanos, mine), lease.seq
            spend.fleet_used, spend.mine_then = lease.fleet_used_nanos, mine
        self.wake()

    def report(self, tenant: Tenant) -> list[pb.BudgetUse]:
        """The tenant's budgets' windows as this node counts them, with what it spent and was
        refused per minute since the last report (read once per report: `reported`)."""
        now = self.wall()
        minutes = max(1e-3, (now - self._reported_at) / 60)
        weight = 1 - math.exp(-minutes * 60 / RATE_S)  # a moving average: a second's noise
        out = []  # does not move the leases
        for rule in tenant.budgets:
            spend = self._spend(tenant.name, rule, now)
            spend.spent_rate += (spend.spent / minutes - spend.spent_rate) * weight
            spend.refused_rate += (spend.refused / minutes - spend.refused_rate) * weight
            ceiling = spend.ceiling if spend.ceiling is not None else rule.static_nanos
            out.append(pb.BudgetUse(
                budget=rule.name, window=spend.window, used_nanos=spend.used,
                held_nanos=spend.held, ceiling_nanos=ceiling,
                lease_seq=spend.seq if spend.ceiling is not None else 0,
                spent_per_minute=spend.spent_rate, refused_per_minute=spend.refused_rate,
            ))  # fmt: skip
        return out

    def report_all(self, demand: pb.Demand) -> None:
        """Every budget's window into the demand report (a tenant with budgets is in it)."""
        told = {t.tenant: t for t in demand.tenants}
        for name, tenant in sorted(self.tenants.items()):
            if tenant.budgets:
                entry = told.get(name)
                if entry is None:
                    entry = told[name] = demand.tenants.add(tenant=name)
                entry.spend.extend(self.report(tenant))
        self.reported()

    def reported(self) -> None:
        """A report went: the rates start again; what was spent is written to disk."""
        self._reported_at = self.wall()
        for spend in self._spends.values():
            spend.spent = spend.refused = 0
        if self.path is not None:
            try:
                self._save(self.path)
            except OSError:
                log.exception("writing what the budgets spent to %s failed", self.path)

    def _save(self, path: Path) -> None:
        doc = {f"{t}\n{b}": {"window": s.window, "ends_s": s.ends_s, "limit": s.limit,
                             "used": s.used + s.held, "ceiling": s.ceiling, "seq": s.seq}
               for (t, b), s in self._spends.items()}  # fmt: skip
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)

    def _load(self, path: Path) -> None:
        """What was spent before a restart (what was held then counts as spent: those
        requests' ends were not seen)."""
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError):
            log.exception("what the budgets spent could not be read from %s", path)
            return
        now = self.wall()
        for name, kept in doc.items():
            tenant, _, budget = name.partition("\n")
            if float(kept["ends_s"]) <= now:
                continue
            spend = Spend(str(kept["window"]), float(kept["ends_s"]), int(kept["limit"]),
                          used=int(kept["used"]), seq=int(kept["seq"]))  # fmt: skip
            spend.ceiling = None if kept["ceiling"] is None else int(kept["ceiling"])
            self._spends[tenant, budget] = spend

    def status(self) -> dict[str, dict[str, dict[str, float | str | None]]]:
        out: dict[str, dict[str, dict[str, float | str | None]]] = {}
        for (tenant, budget), s in sorted(self._spends.items()):
            out.setdefault(tenant, {})[budget] = {
                "window": s.window, "used": s.used / NANOS, "held": s.held / NANOS,
                "ceiling": None if s.ceiling is None else s.ceiling / NANOS,
            }  # fmt: skip
        return out


def duration(seconds: float) -> str:
    """As OpenAI writes a reset: `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.3g}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest}s"


def most_cost(config: RegionConfig, flight: Flight, budgets: Budgets) -> int:
    """The most a request may cost (nanos): its prompt, and its max_tokens (else what its
    model's context leaves) at the output price, for each prompt of a batch; 0 for a model
    with no price now."""
    model = config.models.get(flight.model)
    if model is None or model.prices is None:
        return 0
    request = flight.placement.request
    prompt = request.prompt_tokens + budgets.unseen.get(flight.model, 0)
    out = request.max_new if request.max_new is not None else model.context_length - prompt
    label = flight.ask.service_class.label
    cost = model.prices.cost_nanos(time.time(), prompt, 0, max(0, out), label,
                                   flight.tenant.discount)  # fmt: skip
    return (cost or 0) * max(1, flight.inference.batch)
