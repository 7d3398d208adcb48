"""The router's own view of one worker: its requests in flight from this gateway, the work it
sent there since the last load poll, a circuit breaker, and the worker's speed as learned
from what the gateway observed (prefill rate from TTFT, decode step from inter-token gaps).
It changes only through its own methods (the ledger: sent, first byte, finished, failed,
abandoned, polled, audited); what the router predicts from it is agents/router/predict.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import exp

from agents.router.breaker import Breaker
from agents.router.steps import StepLine
from agents.workers.table import EngineLoad

LEARN_ALPHA = 0.2  # weight of a new observation
MIN_LEARN_TOKENS = 256  # below this a TTFT says more about overheads than prefill speed
RATE_WINDOW_S = 10.0  # the time constant of a worker's smoothed dispatch rate
PLACED_WINDOW_S = 30.0  # ...of the prefixes new to it
QUEUE_WINDOW_S = 5.0  # ...and of its engine's queue
BIAS_MIN_S = 0.05  # a predicted TTFT below this says more about overheads than the model
BIAS_ALPHA = 0.1  # weight of a new first byte in the bias
OVERDUE_MARGIN = 1.1  # an answer running past its expected end has a tenth of it to go
BIAS_MAX = 8.0
POLL_MARGIN_S = 0.05  # a request sent this long before a load poll is in the engine's counts
RESERVE_RATIO = 0.1  # of an answer's tokens an engine keeps KV room for: SGLang's new-token
# ratio, which decays from 0.7 to 0.1 while nothing is retracted (its steady state)


@dataclass
class Flight:
    """A request sent here from this gateway and not yet ended."""

    sent_at: float
    answer: float  # the tokens its answer is expected to take
    tokens: float = 0.0  # the uncached prompt tokens it takes of the pool
    first_at: float | None = None  # its first byte, or (`whole`) when its engine started it
    events: int = 0  # of its stream, relayed so far
    whole: bool = False  # its answer is not streamed: no byte of it comes before its end


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
    mismatch: tuple[float, int] | None = None  # the audit's: since when, and the least excess
    learned: int = 0  # observations behind the two rates
    mean_output: float = 128.0  # tokens an answer sent here is expected to take
    answer_share: float = 1.0  # of a request's max_tokens, the share its answer takes
    batch_step_s: float = 0.0  # the engine's time per token of each running answer, as it
    # reports it (prefill steps between decode steps count): when answers end; 0: unknown
    line: StepLine = field(default_factory=StepLine)  # the engine's step by batch
    decode_batch: float = 1.0  # the engine's batch as the answers behind decode_step_s ran
    bias: float = 1.0  # how much later than predicted first bytes come here, lately (>= 1)
    queue: float = 0.0  # the engine's waiting requests, smoothed over QUEUE_WINDOW_S
    _queue_at: float = 0.0
    _rate: float = 0.0  # requests a second sent here, smoothed over RATE_WINDOW_S
    _placed: float = 0.0  # prefixes new here, smoothed over PLACED_WINDOW_S
    _rate_at: float = 0.0
    _flights: dict[int, Flight] = field(default_factory=dict)  # dispatch -> flight, in order
    _unstarted: int = 0
    _whole: int = 0  # of those unstarted, the answers that come whole (not streamed)
    _running: int = 0  # of the flights, those started, with the sums of their answers and
    _answers: float = 0.0  # first-byte times (what is to come of them, in O(1))
    _firsts: float = 0.0
    tokens_per_event: float = 0.0  # of a streamed answer, learned from usage; 0: not known
    _counted: int = 0  # of those started, the streamed ones whose events are counted, with
    _counted_firsts: float = 0.0  # the sums of their first-byte times and of their events
    _events: int = 0

    # The ledger: what the router saw of the requests it sent, and only through these. The
    # router (agents/router/router.py) calls them as the gateway reports each ticket.

    def polled(self, polls: int, load: EngineLoad) -> None:
        """The engine's load poll `polls` landed: its load now counts what was sent here."""
        if polls == self.poll_seen:
            return
        self.poll_seen, self.sent_since_poll, self.tokens_since_poll = polls, 0, 0
        self.observe_queue(load.waiting, load.at)
        if self._whole:
            self._whole_started(load)
        if load.step_s > 0:
            self.batch_step_s = load.step_s
            self.line.observe(load.running, load.step_s)

    def _whole_started(self, load: EngineLoad) -> None:
        """Answers that come whole (not streamed) show no byte until they end, yet their
        engine started them long before: a request that runs is not one queued there (taken
        for one, every request sent here would wait for the longest answer running). A poll
        that finds fewer requests waiting in the engine than this gateway's unstarted ones
        sent before it says that the oldest of those have started (by then, at the latest):
        they run from the poll on."""
        cutoff = load.at - POLL_MARGIN_S
        unstarted = [(key, flight) for key, flight in self._flights.items()
                     if flight.first_at is None and flight.sent_at <= cutoff]  # fmt: skip
        for key, flight in unstarted[: max(0, len(unstarted) - load.waiting)]:
            if flight.whole:  # a stream says so itself, with its first byte
                self.started(key, load.at)
                self.queued_tokens = max(0, self.queued_tokens - int(flight.tokens))

    def sent(
        self,
        key: int,
        at: float,
        uncached: int,
        answer: float,
        placed: bool,
        probe: bool = False,
        whole: bool = False,
    ) -> None:
        """A request sent here: `uncached`, its prompt tokens the engine computes; `answer`,
        the tokens its answer is expected to take; `placed`, its prefix new here; `probe`, a
        canary (in flight, but not one of the worker's users': nothing is learned of it);
        `whole`, its answer is not streamed."""
        if not probe:
            self.count_dispatch(at, placed)
        self.inflight += 1
        self.queued_tokens += uncached
        self.sent_since_poll += 1
        self.tokens_since_poll += uncached
        if not probe:  # a canary is no half-open breaker's probe
            self.breaker.dispatched(key)
        self.flew(key, at, answer, uncached, learn=not probe, whole=whole)

    def first_byte(self, key: int, at: float, uncached: int, unpolled: bool) -> None:
        """Its first byte came: its prefill is done, no longer queued work (nor, before the
        next poll, work sent since the last); the worker answers. (An answer that came whole
        may have been taken to have started at a poll: its work left the queue then.)"""
        if self.started(key, at):
            self.queued_tokens = max(0, self.queued_tokens - uncached)
            if unpolled:
                self.tokens_since_poll = max(0, self.tokens_since_poll - uncached)
        self.breaker.succeeded()

    def finished(self, key: int, unpolled: bool) -> Flight | None:
        """Its answer is complete; the flight, as it was."""
        self.inflight = max(0, self.inflight - 1)
        flight = self.landed(key)
        if unpolled:
            self.sent_since_poll = max(0, self.sent_since_poll - 1)
        return flight

    def failed(self, key: int, unstarted: int, unpolled: bool, now: float) -> None:
        """The worker failed it (refused, reset, 5xx), before or while answering.
        `unstarted`: its uncached prompt tokens, if its first byte had not come (else 0)."""
        self._ended(key, unstarted, unpolled)
        self.breaker.failed(now)

    def abandoned(self, key: int, unstarted: int, unpolled: bool, probe: bool = False) -> None:
        """It ended without an answer, not by the worker's fault (the client left, the audit
        ended it, or it was a canary)."""
        self._ended(key, unstarted, unpolled)
        if not probe:
            self.breaker.abandoned(key)

    def _ended(self, key: int, unstarted: int, unpolled: bool) -> None:
        """A request that ended without an answer: its work is no longer the worker's."""
        self.inflight = max(0, self.inflight - 1)
        flight = self.landed(key)
        if flight is not None and flight.first_at is not None:
            unstarted = 0  # taken to have started at a poll: its work left the queue then
        self.queued_tokens = max(0, self.queued_tokens - unstarted)
        if unpolled:
            self.tokens_since_poll = max(0, self.tokens_since_poll - unstarted)
        if unpolled:
            self.sent_since_poll = max(0, self.sent_since_poll - 1)

    def audited(self, excess: int, now: float, hold_s: float) -> int:
        """The audit found `excess` of this gateway's requests here that the engine does not
        hold (0: none): how many of them to end now, once it has disagreed for `hold_s` (the
        least excess it has shown meanwhile), else 0."""
        if excess <= 0:
            self.mismatch = None
            return 0
        since, least = self.mismatch or (now, excess)
        self.mismatch = (since, min(least, excess))
        if now - since < hold_s:
            return 0
        self.mismatch = None
        return min(least, excess)

    def answer(self, max_new: int | None) -> float:
        """The tokens an answer is expected to take: its max_tokens at the share answers here
        take of theirs, or the mean of answers here when the request sets none."""
        return self.mean_output if max_new is None else max(1.0, max_new * self.answer_share)

    def flew(
        self,
        key: int,
        at: float,
        answer: float,
        tokens: float = 0.0,
        learn: bool = True,
        whole: bool = False,
    ) -> None:
        self._flights[key] = Flight(at, answer, tokens, whole=whole)
        self._unstarted += 1
        self._whole += whole
        if learn:
            self.mean_output += LEARN_ALPHA * (answer - self.mean_output)

    def started(self, key: int, at: float) -> bool:
        """It runs from `at` (False: it ran already, or is not here)."""
        flight = self._flights.get(key)
        if flight is None or flight.first_at is not None:
            return False
        flight.first_at = at
        self._unstarted -= 1
        self._whole -= flight.whole
        self._running += 1
        self._answers += flight.answer
        self._firsts += at
        return True

    def progressed(self, key: int, events: int) -> None:
        """Events of a started answer's stream relayed: how far it has run, counted, where
        time would only guess it."""
        flight = self._flights.get(key)
        if flight is None or flight.first_at is None or events <= 0:
            return
        if not flight.events:
            self._counted += 1
            self._counted_firsts += flight.first_at
        flight.events += events
        self._events += events

    def learn_events(self, tokens: int, events: int) -> None:
        """A streamed answer's tokens over the events it came in (the engine's stream
        interval, and the events that carry no token)."""
        if tokens > 0 and events > 0:
            seen = tokens / events
            rate = self.tokens_per_event
            self.tokens_per_event = seen if rate <= 0 else rate + LEARN_ALPHA * (seen - rate)

    def landed(self, key: int) -> Flight | None:
        """The flight ended, as it was."""
        flight = self._flights.pop(key, None)
        if flight is None:
            return None
        if flight.first_at is None:
            self._unstarted -= 1
            self._whole -= flight.whole
            return flight
        self._running -= 1
        self._answers -= flight.answer
        self._firsts -= flight.first_at
        if flight.events:
            self._counted -= 1
            self._counted_firsts -= flight.first_at
            self._events -= flight.events
        if self._running == 0:  # no rounding left behind
            self._answers = self._firsts = self._counted_firsts = 0.0
            self._counted = self._events = 0
        return flight

    @property
    def unstarted(self) -> int:
        """Requests sent here from this gateway that have not started (no first byte)."""
        return self._unstarted

    def rate(self, now: float) -> float:
        """Requests a second this gateway sends here: under cache affinity, the traffic its
        cached prefixes draw, so the load a new prefix would share."""
        return self._rate * exp(-(now - self._rate_at) / RATE_WINDOW_S)

    def count_dispatch(self, now: float, placed: bool) -> None:
        """`placed`: the request's prefix was not cached here, and now is: its later requests
        will follow it here."""
        rate, new = self.rate(now) + 1 / RATE_WINDOW_S, self.placed(now) + (1 if placed else 0)
        self._rate, self._placed, self._rate_at = rate, new, now

    def placed(self, now: float) -> float:
        """Prefixes new here lately, smoothed over PLACED_WINDOW_S: traffic they will draw
        that the rate does not show yet."""
        return self._placed * exp(-(now - self._rate_at) / PLACED_WINDOW_S)

    def observe_queue(self, waiting: int, now: float) -> None:
        """A poll's queue: the smoothed queue is what work added here is expected to delay
        (a moment's empty queue on a busy worker is no promise for the next seconds)."""
        weight = 1 - exp(-max(0.0, now - self._queue_at) / QUEUE_WINDOW_S)
        self.queue += weight * (waiting - self.queue)
        self._queue_at = now

    def learn_bias(self, predicted_s: float, actual_s: float) -> None:
        """A first byte against its prediction. Admission scales its prediction by the bias:
        what the model misses here (a queue it did not see, a step it has not learned yet)
        is paid for by a request held at the gateway that would have missed its SLO, not
        found out afterwards."""
        if predicted_s < BIAS_MIN_S:
            return
        ratio = actual_s / predicted_s
        self.bias = min(BIAS_MAX, max(1.0, self.bias + BIAS_ALPHA * (ratio - self.bias)))

    def learn_output(self, tokens: int, max_new: int | None) -> None:
        """An answer's length: of its max_tokens, or of answers here without one."""
        if max_new:
            self.answer_share += LEARN_ALPHA * (min(1.0, tokens / max_new) - self.answer_share)
        else:
            self.mean_output += LEARN_ALPHA * (tokens - self.mean_output)

    def learn_prefill(self, tokens: float, seconds: float) -> None:
        if tokens < MIN_LEARN_TOKENS or seconds <= 0:
            return
        sample = tokens / seconds
        # a queue the router did not see makes one TTFT look slow; bound a single step
        sample = min(max(sample, self.prefill_tokens_per_s / 4), self.prefill_tokens_per_s * 4)
        self.prefill_tokens_per_s += LEARN_ALPHA * (sample - self.prefill_tokens_per_s)
        self.learned += 1

    def learn_decode(self, gap_s: float, batch: int = 0) -> None:
        """A decode step seen: an answer's mean inter-token gap (one step at most 4x off),
        and the engine's batch as it ended (what it ran beside)."""
        if gap_s <= 0:
            return
        gap_s = min(max(gap_s, self.decode_step_s / 4), self.decode_step_s * 4)
        self.decode_step_s += LEARN_ALPHA * (gap_s - self.decode_step_s)
        self.decode_batch += LEARN_ALPHA * (max(batch, 1) - self.decode_batch)
