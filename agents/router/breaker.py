"""A worker's circuit breaker: ejected after a few failures in a row, probed by one request
at a time once its cooldown has passed, the cooldown doubling on each failed probe."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

EJECT_AFTER = 3  # failures in a row open the breaker
COOLDOWN_S = 2.0  # first open period; doubles on each failed probe
COOLDOWN_MAX_S = 30.0


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass
class Breaker:
    state: BreakerState = BreakerState.CLOSED
    failures: int = 0
    opened_at: float = 0.0
    cooldown_s: float = COOLDOWN_S
    probing: bool = False

    def allows(self, now: float) -> bool:
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN and now - self.opened_at >= self.cooldown_s:
            self.state, self.probing = BreakerState.HALF_OPEN, False
        return self.state is BreakerState.HALF_OPEN and not self.probing

    def dispatched(self) -> None:
        if self.state is BreakerState.HALF_OPEN:
            self.probing = True  # one request at a time probes a half-open worker

    def succeeded(self) -> None:
        self.state, self.failures, self.probing = BreakerState.CLOSED, 0, False
        self.cooldown_s = COOLDOWN_S

    def failed(self, now: float) -> None:
        self.failures += 1
        if self.state is BreakerState.HALF_OPEN:
            self.cooldown_s = min(COOLDOWN_MAX_S, self.cooldown_s * 2)
            self.state, self.opened_at, self.probing = BreakerState.OPEN, now, False
        elif self.failures >= EJECT_AFTER:
            self.state, self.opened_at = BreakerState.OPEN, now
