"""What each tenant asked of this gateway: cumulative counts, kept on the request path with a
few additions, and turned into rates over the last seconds for the control plane, which
splits each tenant's global quota by them (see controlplane/services/quotas).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.demand import RATES

WINDOW_S = 3.0  # short enough to follow traffic within seconds, long enough to be steady


@dataclass(slots=True)
class Tally:
    """One tenant's counts since the gateway started."""

    admitted_requests: float = 0.0
    refused_requests: float = 0.0
    admitted_tokens: float = 0.0
    refused_tokens: float = 0.0
    refused_by_reason: dict[str, float] = field(default_factory=dict)
    concurrent: int = 0  # its requests under way here now
    peak_concurrent: int = 0  # the most at once since the last report
    refused_concurrent: float = 0.0  # refused for its limit of requests under way

    def refused(self, reason: str, tokens: int = 0, *, quota: bool = False) -> None:
        self.refused_by_reason[reason] = self.refused_by_reason.get(reason, 0.0) + 1
        if quota:
            self.refused_requests += 1
            self.refused_tokens += tokens

    def copy(self) -> Tally:
        return Tally(self.admitted_requests, self.refused_requests, self.admitted_tokens,
                     self.refused_tokens, dict(self.refused_by_reason), self.concurrent,
                     self.peak_concurrent, self.refused_concurrent)  # fmt: skip

    def began(self) -> None:
        self.concurrent += 1
        self.peak_concurrent = max(self.peak_concurrent, self.concurrent)


class DemandMeter:
    def __init__(
        self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s = window_s
        self.clock = clock
        self.tallies: dict[str, Tally] = {}
        self._samples: deque[tuple[float, dict[str, Tally]]] = deque()
        self.started = clock()

    def tally(self, tenant: str) -> Tally:
        found = self.tallies.get(tenant)
        if found is None:
            found = self.tallies[tenant] = Tally()
        return found

    def report(self) -> pb.Demand:
        """Each tenant's rates per minute over the last `window_s` (or since the start), for
        tenants with any; the tenants with none are left out."""
        now = self.clock()
        sample = {t: v.copy() for t, v in self.tallies.items()}
        # the oldest sample kept is the newest one at least a window old
        while len(self._samples) >= 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()
        then, old = self._samples[0] if self._samples else (self.started, {})
        self._samples.append((now, sample))
        span = max(now - then, 1e-3)
        demand = pb.Demand(window_s=span)
        for tenant, tally in sorted(sample.items()):
            before = old.get(tenant, Tally())
            told = pb.TenantDemand(tenant=tenant)
            moved = False
            for name in RATES:
                delta = getattr(tally, name) - getattr(before, name)
                setattr(told, name, max(0.0, delta) * 60 / span)
                moved = moved or delta > 0
            for reason, count in tally.refused_by_reason.items():
                delta = count - before.refused_by_reason.get(reason, 0.0)
                if delta > 0:
                    told.refused_by_reason[reason] = delta * 60 / span
            # of its limit of requests under way: the most it held, and what it was refused
            told.peak_concurrent = tally.peak_concurrent
            told.refused_concurrent = max(0.0, tally.refused_concurrent - before.refused_concurrent)
            self.tallies[tenant].peak_concurrent = self.tallies[tenant].concurrent
            if moved or told.refused_by_reason or told.peak_concurrent:
                demand.tenants.append(told)
        return demand
