"""Route receipts: a few recent requests, sampled, with where each went and why. Heartbeats
carry them to the control plane, whose status page shows the fleet's newest.

Sampling is by time, so the cost per request is one comparison: at most one answered request
a second is kept, and, since they are what an operator looks for, one refused or escalated
request every tenth of a second.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from agents.metrics import Settled

KEEP = 12


@dataclass(frozen=True)
class Receipt:
    at: float  # wall clock, seconds
    request_id: str
    model: str
    tenant: str
    status: int
    served_by: str
    policy: str
    reason: str
    came_from: str
    ttft_ms: float | None
    duration_ms: float


class Receipts:
    def __init__(
        self,
        every_s: float = 1.0,
        notable_every_s: float = 0.1,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.every_s, self.notable_every_s, self._wall = every_s, notable_every_s, wall
        self.kept: deque[Receipt] = deque(maxlen=KEEP)
        self._last = float("-inf")

    def note(self, request_id: str, status: int, started: float, now: float, served: Settled,
             error: str | None) -> None:  # fmt: skip
        """`started` and `now` are the gateway's monotonic clock."""
        since = now - self._last
        if since < self.notable_every_s:
            return
        if (
            since < self.every_s
            and status == 200
            and not served.came_from
            and not (served.worker.startswith("peer:"))
            and not served.migrated
        ):
            return
        self._last = now
        first = served.first_at
        self.kept.append(
            Receipt(
                at=self._wall(),
                request_id=request_id,
                model=served.model,
                tenant=served.tenant,
                status=status,
                served_by=served.worker,
                policy=served.policy,
                reason=(error or served.reason)
                + (f"; carried on: {served.migrated}" if served.migrated else ""),
                came_from=served.came_from,
                ttft_ms=round((first - started) * 1000, 1) if first is not None else None,
                duration_ms=round((now - started) * 1000, 1),
            )
        )
