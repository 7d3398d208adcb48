"""Each tenant's requests and tokens per minute, as token buckets on this node's share.

A request takes one request and its estimated prompt tokens when admitted, held by `with`
until it ends; the bucket is then charged what it really used (nothing, for a request that
failed, and the estimate for one whose use is not known). A bucket may go below zero by what
a request used beyond its estimate; the next request waits for the refill. Levels survive a
new snapshot.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from agents.control.compile import Tenant
from agents.gateway.errors import QuotaExceeded
from agents.held import Held


@dataclass
class Bucket:
    """Fills at `per_minute` (a node's share, which may be a fraction), up to a minute's worth
    or one, whichever is more, so that a share under one a minute still admits at its rate."""

    per_minute: float
    level: float
    at: float

    @property
    def capacity(self) -> float:
        return max(1.0, self.per_minute) if self.per_minute > 0 else 0.0

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.per_minute / 60)
        self.at = now

    def wait_s(self, need: float) -> int:
        """Seconds until `need` is there (a minute, for a bucket with no share here)."""
        if self.per_minute <= 0:
            return 60
        return max(1, math.ceil((need - self.level) * 60 / self.per_minute))


class Quotas:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._requests: dict[str, Bucket] = {}
        self._tokens: dict[str, Bucket] = {}

    def _bucket(self, buckets: dict[str, Bucket], tenant: str, per_minute: float) -> Bucket:
        now = self.clock()
        bucket = buckets.get(tenant)
        if bucket is None:
            bucket = buckets[tenant] = Bucket(per_minute, 0.0, now)
            bucket.level = bucket.capacity
        elif bucket.per_minute != per_minute:  # a new share: keep the level, within it
            bucket.per_minute = per_minute
            bucket.level = min(bucket.level, bucket.capacity)
        bucket.refill(now)
        return bucket

    def admit(self, tenant: Tenant, prompt_tokens: int) -> Charge:
        """Take one request and the prompt's tokens, or raise QuotaExceeded with Retry-After;
        the tokens are settled when the `with` block of the charge ends."""
        requests = tokens = None
        if tenant.requests_per_minute is not None:
            requests = self._bucket(self._requests, tenant.name, tenant.requests_per_minute)
            if requests.level < 1:
                raise QuotaExceeded(
                    f"tenant {tenant.name} is over its requests per minute",
                    retry_after_s=requests.wait_s(1),
                )
        if tenant.tokens_per_minute is not None:
            tokens = self._bucket(self._tokens, tenant.name, tenant.tokens_per_minute)
            need = min(prompt_tokens, tokens.capacity) if tokens.capacity else 1
            if tokens.level < need:
                raise QuotaExceeded(
                    f"tenant {tenant.name} is over its tokens per minute",
                    retry_after_s=tokens.wait_s(need),
                )
        if requests is not None:
            requests.level -= 1
        if tokens is not None:
            tokens.level -= prompt_tokens
        return Charge(self, tenant, prompt_tokens)

    def settle(self, tenant: Tenant, estimated: int, used: int) -> None:
        """Charge what the request really used instead of its estimate."""
        bucket = self._tokens.get(tenant.name)
        if bucket is not None:
            bucket.level -= used - estimated


class Charge(Held):
    """A request's tokens, taken at admission: `used` is set when the answer tells it."""

    __slots__ = ("estimated", "quotas", "tenant", "used")

    def __init__(self, quotas: Quotas | None, tenant: Tenant, estimated: int) -> None:
        super().__init__()
        self.quotas, self.tenant, self.estimated = quotas, tenant, estimated
        self.used: int | None = None  # None: not known, the estimate stands

    def release(self, error: BaseException | None) -> None:
        if self.quotas is None:
            return
        if error is not None:
            self.quotas.settle(self.tenant, self.estimated, 0)  # failed: only the request counts
        elif self.used is not None:
            self.quotas.settle(self.tenant, self.estimated, self.used)


def uncharged(tenant: Tenant) -> Charge:
    """A request counted elsewhere (escalated here) or not at all (the operator's)."""
    return Charge(None, tenant, 0)
