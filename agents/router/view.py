"""The router's own view of one worker: its requests in flight from this gateway, the work it
sent there since the last load poll, a circuit breaker, and the worker's speed as learned
from what the gateway observed (prefill rate from TTFT, decode step from inter-token gaps)."""

from __future__ import annotations

import math
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
RESERVE_RATIO = 0.1  # of an answer's tokens an engine keeps KV room for: SGLang's new-token
# ratio, which decays from 0.7 to 0.1 while nothing is retracted (its steady state)


@dataclass
class Flight:
    """A request sent here from this gateway and not yet ended."""

    sent_at: float
    answer: float  # the tokens its answer is expected to take
    tokens: float = 0.0  # the uncached prompt tokens it takes of the pool
    first_at: float | None = None
    events: int = 0  # of its stream, relayed so far


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
        if load.step_s > 0:
            self.batch_step_s = load.step_s
            self.line.observe(load.running, load.step_s)

    def sent(
        self, key: int, at: float, uncached: int, answer: float, placed: bool, probe: bool = False
    ) -> None:
        """A request sent here: `uncached`, its prompt tokens the engine computes; `answer`,
        the tokens its answer is expected to take; `placed`, its prefix new here; `probe`, a
        canary (in flight, but not one of the worker's users': nothing is learned of it)."""
        if not probe:
            self.count_dispatch(at, placed)
        self.inflight += 1
        self.queued_tokens += uncached
        self.sent_since_poll += 1
        self.tokens_since_poll += uncached
        if not probe:  # a canary is no half-open breaker's probe
            self.breaker.dispatched()
        self.flew(key, at, answer, uncached, learn=not probe)

    def first_byte(self, key: int, at: float, uncached: int, unpolled: bool) -> None:
        """Its first byte came: its prefill is done, no longer queued work (nor, before the
        next poll, work sent since the last); the worker answers."""
        self.started(key, at)
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
            self.breaker.probing = False

    def _ended(self, key: int, unstarted: int, unpolled: bool) -> None:
        """A request that ended without an answer: its work is no longer the worker's."""
        self.inflight = max(0, self.inflight - 1)
        self.landed(key)
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
        self, key: int, at: float, answer: float, tokens: float = 0.0, learn: bool = True
    ) -> None:
        self._flights[key] = Flight(at, answer, tokens)
        self._unstarted += 1
        if learn:
            self.mean_output += LEARN_ALPHA * (answer - self.mean_output)

    def started(self, key: int, at: float) -> None:
        flight = self._flights.get(key)
        if flight is not None and flight.first_at is None:
            flight.first_at = at
            self._unstarted -= 1
            self._running += 1
            self._answers += flight.answer
            self._firsts += at

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

    def _ran(self, flight: Flight, now: float, step: float) -> float:
        """Tokens a started answer has run: counted from its stream's events, or by time."""
        assert flight.first_at is not None
        if flight.events and self.tokens_per_event > 0:
            return flight.events * self.tokens_per_event
        return (now - flight.first_at) / step

    @property
    def unstarted(self) -> int:
        """Requests sent here from this gateway that have not started (no first byte)."""
        return self._unstarted

    def head_age(self, now: float) -> float:
        """How long the oldest request sent here that has not started has waited: the delay
        the engine's queue puts on a request now (as CoDel reads a queue by its packets'
        sojourn), whatever holds it back (prefill ahead, KV room, retractions). It rises at
        once when an engine stalls and falls to nothing when its queue from here empties."""
        if self._unstarted:
            for flight in self._flights.values():
                if flight.first_at is None:
                    return max(0.0, now - flight.sent_at)
        return 0.0

    def finish_s(self, share: float, now: float, batch: float = 0.0) -> float:
        """Seconds until `share` of the engine's running batch has finished. The requests
        this gateway has running there say when theirs end (each its expected answer at the
        decode step, less what it has run): a batch that started together finishes together,
        which an average over the batch does not show. Past the batch, or with none of ours
        running, answers end at the batch's turnover (Little's law)."""
        if share <= 0:
            return 0.0
        step = self._running_step(now, batch)
        turnover_s = self.mean_output * step
        left = sorted(
            max(0.0, (f.answer - self._ran(f, now, step)) * step)
            for f in self._flights.values()
            if f.first_at is not None
        )
        if not left:
            return share * turnover_s
        if share > 1:
            return left[-1] + (share - 1) * turnover_s
        return left[max(0, math.ceil(share * len(left)) - 1)]

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

    def room_wait(
        self,
        need: float,
        load: EngineLoad,
        now: float,
        answer: float | None = None,
        reserve_ratio: float = RESERVE_RATIO,
    ) -> float:
        """Seconds until the engine's KV pool has room for `need` more tokens after what is
        queued there: SGLang admits a request only with room for its uncached prompt and a
        share of each running answer's rest and of its own (`answer` tokens, by default the
        mean here). At a `reserve_ratio` of 1, room for every answer to finish, so that
        nothing started is retracted (when room runs out an engine retracts its newest
        request, which then waits for room again, often before its first chunk). When the
        pool is short, a request waits for running ones to end and free theirs (`_room_at`).
        Without the pool's size, waiting requests are taken to be held back for room."""
        if load.running <= 0 and self.sent_since_poll <= 0:
            return 0.0
        if load.max_total_tokens <= 0:
            return self.held_wait(load, now)  # one finished request each
        answer = self.mean_output if answer is None else answer
        queued = (
            load.pending_tokens
            + self.tokens_since_poll
            + (load.waiting + self.sent_since_poll) * self.mean_output * reserve_ratio
        )
        free = load.max_total_tokens - load.used_tokens - queued - need
        reserve = (self.to_come(load, now) + answer) * reserve_ratio
        if free >= reserve:
            return 0.0
        at = self._room_at(load, now, free, answer, reserve_ratio)
        if at is not None:
            return at
        # the requests queued for room go first (when prefixes are evicted for room, tokens
        # count short), then this one as room for it frees; a finishing share of the batch
        # frees that share of what it holds
        used = max(load.used_tokens, 1)
        own = need + answer * reserve_ratio
        short = reserve - free
        share = max(short / used, self._held_share(load) + own / used)
        return self.finish_s(share, now, load.running)

    def _room_at(
        self, load: EngineLoad, now: float, free: float, answer: float, ratio: float
    ) -> float | None:
        """Seconds until the pool, short of room now by what `free` lacks, has it: the
        running answers go on a token a step (each taking pool, and needing that much less
        reserved), and each frees, as it ends, what it holds (its uncached prompt and its
        answer). The requests this gateway has running here stand for the engine's whole
        batch (others' are taken to be like them). None: none of ours run here."""
        step = self._running_step(now, load.running)
        rest = sorted(
            (max(0.0, f.answer - self._ran(f, now, step)), f.tokens + f.answer)
            for f in self._flights.values()
            if f.first_at is not None
        )
        if not rest:
            return None
        scale = max(1.0, load.running / len(rest))
        to_come = sum(r for r, _ in rest)
        # what they hold now, shared prefixes once: an end frees its share of the pool used
        held = sum(holds for _, holds in rest) - to_come
        share = min(1.0, load.used_tokens / scale / held) if held > 0 else 1.0
        growing, freed = len(rest), 0.0
        for r, holds in rest:  # r steps from now, just after this one ends
            growing -= 1
            freed += (holds - r) * share  # what it held now; it grew its rest first
            to_come -= r
            taken = scale * (growing * r - freed)
            reserve = ratio * (scale * (to_come - growing * r) + answer)
            if free - taken >= reserve:
                return r * step
        return rest[-1][0] * step

    def step_at(self, batch: float) -> float:
        """The time per token of an answer here with `batch` requests running: as answers
        here have lately run (their mean gaps, measured, not a gauge of the moment), moved
        along the engine's step line from the batch they ran in to this one."""
        slope = self.line.slope() or 0.0
        slope = min(slope, self.decode_step_s / max(self.decode_batch, 1.0))
        return max(self.decode_step_s / 4, self.decode_step_s + slope * (batch - self.decode_batch))

    def to_come(self, load: EngineLoad, now: float) -> float:
        """Answer tokens the engine's running requests have still to generate: of those this
        gateway has running there, their expected answers less what they have run (counted
        from their streams' events, else by time at the step; a batch that started together
        has nearly all of its answers to come); of others, half an answer each."""
        step = self._running_step(now, load.running)
        if self.tokens_per_event > 0:  # the streams' events count; the others run by time
            timed = self._running - self._counted
            run = self._events * self.tokens_per_event
            run += (timed * now - (self._firsts - self._counted_firsts)) / step
        else:
            run = (self._running * now - self._firsts) / step
        left = max(0.0, self._answers - run)
        others = max(0, load.running - self._running)
        # ours that the engine has started and that have sent no byte yet (sent before the
        # poll, and not among those it holds back): their whole answers are to come
        mine = min(others, max(0, self._unstarted - self.sent_since_poll - load.waiting))
        return left + mine * self.mean_output + (others - mine) * self.mean_output / 2

    def _answer_step(self) -> float:
        return max(self.decode_step_s, self.batch_step_s)

    def _running_step(self, now: float, batch: float) -> float:
        """The time per token of the answers running here: as learned, and at least as the
        engine's step at this batch (the step line); and when one runs past its expected end
        (it has not run all of its tokens), as that one shows, with a margin: an answer taken
        to have ended while it runs would be taken to have freed its room, and the requests
        waiting for that room taken to start now. The oldest sent stands for the longest
        running."""
        step = max(self._answer_step(), self.step_at(batch)) if batch > 0 else self._answer_step()
        if not self._running:
            return step
        # the oldest sent of those started (flights are kept in the order they were sent)
        oldest = next(f for f in self._flights.values() if f.first_at is not None)
        shown = (now - (oldest.first_at or now)) / max(oldest.answer, 1.0)
        return step if shown <= step else OVERDUE_MARGIN * shown

    def held_wait(self, load: EngineLoad, now: float) -> float:
        """Seconds the requests an engine holds back (as polled, and sent since) take to
        start when each waits for a running one to finish and free its room. An engine that
        reserves more room than the pool arithmetic shows, or retracts, holds them so."""
        return self.finish_s(self._held_share(load), now, load.running)

    def _held_share(self, load: EngineLoad) -> float:
        if load.waiting <= 0 or load.running <= 0:
            return 0.0
        return (load.waiting + self.sent_since_poll) / load.running

    def queued_work(self, pending_tokens: int) -> float:
        """Prefill tokens ahead of a new request here: the engine's waiting uncached prompt
        tokens (as it estimates them: `num_waiting_uncached_tokens`), plus what was sent
        since the poll; at least what this gateway knows it has queued there."""
        engine = pending_tokens + self.tokens_since_poll
        return max(engine, self.queued_tokens)

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
