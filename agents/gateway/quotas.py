"""Each tenant's requests and tokens per minute, as token buckets on this node's share.

A request takes one request and its estimated prompt tokens when admitted; when it ends the
bucket is charged what it really used. A bucket may go below zero by what a request used
beyond its estimate; the next request waits for the refill. Levels survive a new snapshot.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from agents.control.compile import Tenant
from agents.gateway.errors import QuotaExceeded


@dataclass
class Bucket:
    per_minute: float
    level: float
    at: float

    def refill(self, now: float) -> None:
        self.level = min(self.per_minute, self.level + (now - self.at) * self.per_minute / 60)
        self.at = now

    def wait_s(self, need: float) -> int:
        """Seconds until `need` is there."""
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
            bucket = buckets[tenant] = Bucket(per_minute, per_minute, now)
        elif bucket.per_minute != per_minute:  # a new share: keep the level, within it
            bucket.per_minute, bucket.level = per_minute, min(bucket.level, per_minute)
        bucket.refill(now)
        return bucket

    def admit(self, tenant: Tenant, prompt_tokens: int) -> None:
        """Take one request and the prompt's tokens, or raise QuotaExceeded with Retry-After."""
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
            need = min(prompt_tokens, tokens.per_minute)
            if tokens.level < need:
                raise QuotaExceeded(
                    f"tenant {tenant.name} is over its tokens per minute",
                    retry_after_s=tokens.wait_s(need),
                )
        if requests is not None:
            requests.level -= 1
        if tokens is not None:
            tokens.level -= prompt_tokens

    def settle(self, tenant: Tenant, estimated: int, used: int) -> None:
        """Charge what the request really used instead of its estimate."""
        bucket = self._tokens.get(tenant.name)
        if bucket is not None:
            bucket.level -= used - estimated
