"""Each tenant's requests and tokens per minute, as token buckets on this node's share.

The share is the node's lease from the control plane while it holds one (the leader splits
each tenant's global quota over the agents by their demand: controlplane/services/quotas),
else its static share from the snapshot (the region's part by GPUs, split over its nodes),
which never over-admits. A lease is good for its ttl from the message that carried or last
renewed it, and only for the global quota it was computed from.

A request takes one request and its estimated prompt tokens when admitted, held by `with`
until it ends; the bucket is then charged what it really used (nothing, for a request that
failed, and the estimate for one whose use is not known). A bucket may go below zero by what
a request used beyond its estimate; the next request waits for the refill. Levels survive a
new snapshot and a new lease.

A tenant's requests under way at once are limited the same way: the node's share of its
global limit (leased by demand, else static), counted from admission until the request
ends, by the same `with`; past it, 429 `tenant_concurrency`. At least one request is always
allowed here.

A bucket holds `BURST_S` seconds of its rate (at least one request): short enough that the
fleet, whose shares sum to the quota, admits at most a few percent over it in any minute;
a client that sends a burst is paced, as OpenAI's own limits pace it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.assertion import CONTROL_PLANE

from agents.config import RegionConfig, Tenant
from agents.gateway.budgets import Budgets, Hold, duration, most_cost
from agents.gateway.demand import DemandMeter
from agents.gateway.errors import BudgetExceeded, QuotaExceeded, TenantConcurrency
from agents.gateway.flight import OPERATOR, Flight
from agents.held import Held

BURST_S = 2.0


@dataclass
class Bucket:
    """Fills at `per_minute` (a node's share, which may be a fraction), up to `BURST_S` of
    it or one, whichever is more, so that a share under one a minute still admits at its
    rate."""

    per_minute: float
    level: float
    at: float

    @property
    def capacity(self) -> float:
        return max(1.0, self.per_minute * BURST_S / 60) if self.per_minute > 0 else 0.0

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.per_minute / 60)
        self.at = now

    def wait_s(self, need: float) -> int:
        """Seconds until `need` is there (a minute, for a bucket with no share here)."""
        if self.per_minute <= 0:
            return 60
        return max(1, math.ceil((need - self.level) * 60 / self.per_minute))

    def full_in_s(self) -> float:
        """Seconds until the bucket is full again (OpenAI's `x-ratelimit-reset-*`)."""
        if self.per_minute <= 0:
            return 60.0
        return max(0.0, (self.capacity - self.level) * 60 / self.per_minute)


@dataclass(slots=True)
class Lease:
    requests_per_minute: float | None
    tokens_per_minute: float | None
    quota_requests_per_minute: int | None
    quota_tokens_per_minute: int | None
    expires_at: float  # on the gateway's clock
    concurrent_requests: float | None = None
    quota_concurrent_requests: int | None = None


class Quotas:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._requests: dict[str, Bucket] = {}
        self._tokens: dict[str, Bucket] = {}
        self.leases: dict[str, Lease] = {}
        self.demand = DemandMeter(clock=clock)
        self.budgets = Budgets()  # the tenants' spend budgets (agents/gateway/budgets.py)

    def take_leases(self, message: pb.Leases) -> None:
        """New and changed leases; every lease held is good for the message's ttl from now."""
        expires = self.clock() + message.ttl_s
        self.budgets.heard_until = time.monotonic() + message.ttl_s  # a lease may come: wait
        for tenant in message.dropped:
            self.leases.pop(tenant, None)
        for lease in message.set:
            self.leases[lease.tenant] = Lease(
                lease.requests_per_minute if lease.HasField("requests_per_minute") else None,
                lease.tokens_per_minute if lease.HasField("tokens_per_minute") else None,
                _opt(lease, "quota_requests_per_minute"),
                _opt(lease, "quota_tokens_per_minute"),
                expires,
                lease.concurrent_requests if lease.HasField("concurrent_requests") else None,
                _opt(lease, "quota_concurrent_requests"),
            )
        for held in self.leases.values():
            held.expires_at = expires
        tenants = self.budgets.tenants
        for lease in message.set:
            if lease.spend and lease.tenant in tenants:
                self.budgets.take(tenants[lease.tenant], list(lease.spend))

    def report(self) -> pb.Demand:
        """What the tenants asked of this node, and their budgets' windows as it counts them."""
        demand = self.demand.report()
        self.budgets.report_all(demand)
        return demand

    def shares(self, tenant: Tenant, now: float) -> tuple[float | None, float | None]:
        """This node's requests and tokens per minute for the tenant, now."""
        requests, tokens = tenant.requests_per_minute, tenant.tokens_per_minute
        lease = self.leases.get(tenant.name)
        if lease is not None and lease.expires_at > now:
            if (
                lease.requests_per_minute is not None
                and requests is not None
                and lease.quota_requests_per_minute == tenant.quota_requests_per_minute
            ):
                requests = lease.requests_per_minute  # fmt: skip
            if (
                lease.tokens_per_minute is not None
                and tokens is not None
                and lease.quota_tokens_per_minute == tenant.quota_tokens_per_minute
            ):
                tokens = lease.tokens_per_minute  # fmt: skip
        return requests, tokens

    def concurrency(self, tenant: Tenant, now: float) -> float | None:
        """This node's share of the tenant's limit of requests under way, now (at least 1)."""
        share = tenant.max_concurrency
        if share is None:
            return None
        lease = self.leases.get(tenant.name)
        if (
            lease is not None
            and lease.expires_at > now
            and lease.concurrent_requests is not None
            and lease.quota_concurrent_requests == tenant.quota_concurrency
        ):
            share = lease.concurrent_requests
        return max(1.0, share)

    def _bucket(
        self, buckets: dict[str, Bucket], tenant: str, per_minute: float, now: float
    ) -> Bucket:
        bucket = buckets.get(tenant)
        if bucket is None:
            bucket = buckets[tenant] = Bucket(per_minute, 0.0, now)
            bucket.level = bucket.capacity
        elif bucket.per_minute != per_minute:  # a new share: keep the level, within it
            bucket.refill(now)
            bucket.per_minute = per_minute
            bucket.level = min(bucket.level, bucket.capacity)
        bucket.refill(now)
        return bucket

    async def charge(self, config: RegionConfig, flight: Flight) -> Charge:
        """The request's quota and budgets, held until its answer settles them: none for the
        operator's or a peer's (its region holds them); a batch's line, its budgets alone (the
        batch runner paces lines by the regions' room). Out of this node's part of a budget,
        it may wait for a lease first (Budgets.room)."""
        tenant, came = flight.tenant, flight.caller.came_from
        if tenant is OPERATOR or came not in (None, CONTROL_PLANE):
            return uncharged(tenant)
        most = most_cost(config, flight, self.budgets) if tenant.budgets else 0
        if most:
            await self.budgets.room(tenant, flight.caller.key, most)
        request = flight.placement.request
        charge = self.admit(tenant, request.prompt_tokens, flight.caller.key, most, flight.model,
                            budgets_only=came is not None)  # fmt: skip
        flight.hold = charge.hold
        return charge

    def admit(
        self,
        tenant: Tenant,
        prompt_tokens: int,
        key: str = "",
        most: int = 0,
        model: str = "",
        budgets_only: bool = False,
    ) -> Charge:
        """Take one request and the prompt's tokens, or raise QuotaExceeded with Retry-After;
        the tokens are settled when the `with` block of the charge ends. `most`: what it may
        cost at most (nanos), held in the tenant's budgets (BudgetExceeded) until its usage
        settles it (agents/gateway/settle.py). `budgets_only`: a batch's line, held in its
        tenant's budgets and not its quota (the batch runner paces lines by the regions'
        room)."""
        hold = self.reserve(tenant, prompt_tokens, key, most, model)
        if budgets_only:
            charge = uncharged(tenant)
            charge.hold = hold
            return charge
        admitted = False
        try:
            charge = self._admit(tenant, prompt_tokens)
            admitted = True
        finally:
            if not admitted:  # refused for a quota: what it held in its budgets is given back
                self.budgets.settle(hold, 0)
        charge.hold = hold
        return charge

    def reserve(self, tenant: Tenant, prompt_tokens: int, key: str, most: int,
                model: str) -> Hold | None:  # fmt: skip
        try:
            return self.budgets.reserve(tenant, key, most, model)
        except BudgetExceeded:
            self.demand.tally(tenant.name).refused("budget_exceeded", prompt_tokens)
            raise

    def _admit(self, tenant: Tenant, prompt_tokens: int) -> Charge:
        now = self.clock()
        rpm, tpm = self.shares(tenant, now)
        requests = tokens = None
        tally = self.demand.tally(tenant.name)
        limit = self.concurrency(tenant, now)
        if limit is not None and tally.concurrent + 1 > limit:
            tally.refused("tenant_concurrency")
            tally.refused_concurrent += 1
            raise TenantConcurrency(
                f"tenant {tenant.name} has {tally.concurrent} requests under way here, its "
                f"share ({limit:g}) of its limit of {tenant.quota_concurrency} at once",
                retry_after_s=1,
            )
        if rpm is not None:
            requests = self._bucket(self._requests, tenant.name, rpm, now)
            if requests.level < 1:
                tally.refused("quota_requests", prompt_tokens, quota=True)
                raise self._refused(tenant, "requests", requests.wait_s(1))
        if tpm is not None:
            tokens = self._bucket(self._tokens, tenant.name, tpm, now)
            need = min(prompt_tokens, tokens.capacity) if tokens.capacity else 1
            if tokens.level < need:
                tally.refused("quota_tokens", prompt_tokens, quota=True)
                raise self._refused(tenant, "tokens", tokens.wait_s(need))
        if requests is not None:
            requests.level -= 1
        if tokens is not None:
            tokens.level -= prompt_tokens
        tally.admitted_requests += 1
        tally.admitted_tokens += prompt_tokens
        tally.began()
        return Charge(self, tenant, prompt_tokens)

    def _refused(self, tenant: Tenant, what: str, retry_after_s: int) -> QuotaExceeded:
        refused = QuotaExceeded(
            f"tenant {tenant.name} is over its {what} per minute", retry_after_s=retry_after_s
        )
        refused.headers = self.rate_limit_headers(tenant)
        return refused

    def rate_limit_headers(self, tenant: Tenant, key: str = "") -> dict[str, str]:
        """OpenAI's `x-ratelimit-*`: the global limit, what this node can admit now, and
        when its bucket is full again; and the tightest budget's, in the same style."""
        headers = self.budgets.headers(tenant, key) if tenant.budgets else {}
        for what, limit, buckets in (
            ("requests", tenant.quota_requests_per_minute, self._requests),
            ("tokens", tenant.quota_tokens_per_minute, self._tokens),
        ):
            bucket = buckets.get(tenant.name)
            if limit is None or bucket is None:
                continue
            headers[f"x-ratelimit-limit-{what}"] = str(limit)
            headers[f"x-ratelimit-remaining-{what}"] = str(max(0, math.floor(bucket.level)))
            headers[f"x-ratelimit-reset-{what}"] = duration(bucket.full_in_s())
        return headers

    def settle(self, tenant: Tenant, estimated: int, used: int) -> None:
        """Charge what the request really used instead of its estimate."""
        self.demand.tally(tenant.name).admitted_tokens += used - estimated
        bucket = self._tokens.get(tenant.name)
        if bucket is not None:
            bucket.level -= used - estimated

    def status(self) -> dict[str, dict[str, float | None]]:
        """Each tenant's lease, as this node holds it (for the agent's status)."""
        now = self.clock()
        return {t: {"requests_per_minute": lease.requests_per_minute,
                    "tokens_per_minute": lease.tokens_per_minute,
                    "concurrent_requests": lease.concurrent_requests,
                    "expires_in_s": round(lease.expires_at - now, 3)}
                for t, lease in sorted(self.leases.items())}  # fmt: skip


def _opt(lease: pb.Lease, name: str) -> int | None:
    return int(getattr(lease, name)) if lease.HasField(name) else None  # type: ignore[arg-type]


class Charge(Held):
    """A request's tokens, taken at admission: `used` is set when the answer tells it."""

    __slots__ = ("estimated", "hold", "quotas", "tenant", "used")

    def __init__(self, quotas: Quotas | None, tenant: Tenant, estimated: int) -> None:
        super().__init__()
        self.quotas, self.tenant, self.estimated = quotas, tenant, estimated
        self.used: int | None = None  # None: not known, the estimate stands
        self.hold: Hold | None = None  # what it may cost, held in the tenant's budgets

    def release(self, error: BaseException | None) -> None:
        if self.quotas is None:
            return
        self.quotas.demand.tally(self.tenant.name).concurrent -= 1
        if error is not None:
            self.quotas.settle(self.tenant, self.estimated, 0)  # failed: only the request counts
        elif self.used is not None:
            self.quotas.settle(self.tenant, self.estimated, self.used)


def uncharged(tenant: Tenant) -> Charge:
    """A request counted elsewhere (escalated here) or not at all (the operator's)."""
    return Charge(None, tenant, 0)
