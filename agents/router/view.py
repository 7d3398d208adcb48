"""The router's own view of one worker: its requests in flight from this gateway, the work it
sent there since the last load poll, a circuit breaker, and the worker's speed as learned
from what the gateway observed (prefill rate from TTFT, decode step from inter-token gaps)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

EJECT_AFTER = 3  # failures in a row open the breaker
COOLDOWN_S = 2.0  # first open period; doubles on each failed probe
COOLDOWN_MAX_S = 30.0
LEARN_ALPHA = 0.2  # weight of a new observation
MIN_LEARN_TOKENS = 64  # below this a TTFT says more about overheads than prefill speed


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


@dataclass
class WorkerView:
    worker_id: str
    prefill_tokens_per_s: float
    decode_step_s: float
    inflight: int = 0  # requests from this gateway, not yet finished
    queued_tokens: int = 0  # prompt tokens sent from here whose first byte has not come
    sent_since_poll: int = 0  # requests sent since the engine's last load poll
    tokens_since_poll: int = 0  # their uncached prompt tokens
    poll_seen: int = 0  # the table's poll count when the two above were reset
    breaker: Breaker = field(default_factory=Breaker)
    learned: int = 0  # observations behind the two rates
    uncached_share: float = 1.0  # of the prompt tokens sent here, the share not cached there
    mean_output: float = 128.0  # tokens an answer here has, learned from usage

    def learn_output(self, tokens: int) -> None:
        self.mean_output += LEARN_ALPHA * (tokens - self.mean_output)

    def memory_wait(self, waiting: int, running: int) -> float:
        """Seconds until the engine's queued requests are admitted, when its KV pool, not its
        prefill, holds them back: each needs a running request to finish, and running
        requests finish at running / (answer length x decode step) a second."""
        if waiting <= 0:
            return 0.0
        return waiting * self.mean_output * self.decode_step_s / max(1, running)

    def sent(self, prompt_tokens: int, uncached_tokens: int) -> None:
        if prompt_tokens > 0:
            share = uncached_tokens / prompt_tokens
            self.uncached_share += LEARN_ALPHA * (share - self.uncached_share)

    def queued_work(self, pending_tokens: int) -> float:
        """Prefill tokens ahead of a new request here: the engine's waiting prompt tokens
        (whole prompts, cached parts too) at the share that is uncached, plus what was sent
        since the poll; at least what this gateway knows it has queued there."""
        engine = pending_tokens * self.uncached_share + self.tokens_since_poll
        return max(engine, self.queued_tokens)

    def learn_prefill(self, tokens: float, seconds: float) -> None:
        if tokens < MIN_LEARN_TOKENS or seconds <= 0:
            return
        sample = tokens / seconds
        # a queue the router did not see makes one TTFT look slow; bound a single step
        sample = min(max(sample, self.prefill_tokens_per_s / 4), self.prefill_tokens_per_s * 4)
        self.prefill_tokens_per_s += LEARN_ALPHA * (sample - self.prefill_tokens_per_s)
        self.learned += 1

    def learn_decode(self, gap_s: float) -> None:
        if gap_s <= 0:
            return
        self.decode_step_s += LEARN_ALPHA * (gap_s - self.decode_step_s)
