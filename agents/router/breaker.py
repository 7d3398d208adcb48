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
    probe: object = None  # the one request probing it while half-open (None: none yet)

    @property
    def probing(self) -> bool:
        return self.probe is not None

    def allows(self, now: float) -> bool:
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN and now - self.opened_at >= self.cooldown_s:
            self.state, self.probe = BreakerState.HALF_OPEN, None
        return self.state is BreakerState.HALF_OPEN and self.probe is None

    def dispatched(self, request: object) -> None:
        """A request sent: while half-open, the first is the one probe."""
        if self.state is BreakerState.HALF_OPEN and self.probe is None:
            self.probe = request

    def abandoned(self, request: object) -> None:
        """A request ended with no verdict on the worker (cancelled, a fault of ours): if it
        was the probe, another may probe. Any other request's end leaves the probe be: a
        request sent before the breaker opened must not let a second probe out."""
        if self.probe is not None and self.probe == request:
            self.probe = None

    def succeeded(self) -> None:
        self.state, self.failures, self.probe = BreakerState.CLOSED, 0, None
        self.cooldown_s = COOLDOWN_S

    def failed(self, now: float) -> None:
        self.failures += 1
        if self.state is BreakerState.HALF_OPEN:
            self.cooldown_s = min(COOLDOWN_MAX_S, self.cooldown_s * 2)
            self.state, self.opened_at, self.probe = BreakerState.OPEN, now, None
        elif self.failures >= EJECT_AFTER:
            self.state, self.opened_at = BreakerState.OPEN, now
