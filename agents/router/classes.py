"""Service classes in admission: who goes first when a model is saturated, what each class
may take of a worker, and who is shed first.

- **Fair queueing between classes.** While requests of a model wait, each that looks for
  a worker carries a start tag, as in start-time fair queueing: its class's last tag or the
  model's virtual time, whichever is later, plus one over its class's weight. A request
  that fits goes unless a request of another class with an earlier tag waits and fitted at
  its last look: of the places freed, classes that wait get them in proportion to their
  weights, and none is starved (each class also has a bound on its wait). When nothing
  waits the tags start again: fair queueing costs nothing until it has something to decide.
- **Reserves.** A class's reserve is a share of each worker's KV pool, and of the requests
  its engine runs at once (`max_running_requests`, from /v1/loads), that the classes below
  it may not take, while the class has had a request in the last `ACTIVE_S` (a reserve for
  a class nobody uses would only waste). The slots matter where the engine is bound by
  compute rather than memory: a batch request it runs holds its slot to the end. A request
  escalated here from a peer region never takes the reserve of this region's `interactive`
  traffic. Beyond the reserves, a request does not take the KV room the classes above held
  at their recent peaks and do not hold now (`Holding`): room they are likely to want back
  while its answer runs, which the engine could not take back from it.
- **Slack.** A class with a `max_wait_s` (by default `flex` and `batch`) is admitted against
  a share of the route's TTFT SLO, its wait not counted: it runs where an engine would start
  it that soon, on capacity the classes above leave, and waits up to its bound for it.
- **Lines.** A class with a `max_wait_s` waits in its tenant's line of it, and only the
  first `FRONT` of a line look for a worker. A request that arrives to a line as long as
  what the line has had admitted over the bound lately (and at least `FRONT`) is refused
  429 `overloaded` at once, before it is tokenized or placed: it would reach the front at
  its bound, if at all. A flood of such requests then costs the gateway's loop a refusal
  each, not a tokenizer's pass, a placement and a timer, and its client hears now rather
  than at the bound.
- **Shedding.** A request that finds its model's queue full takes the place of the newest
  waiting request of the lowest class below its own, which is refused 429 `class_shed`.
- **Giving way.** A request that would wait may take the room of a request of a lower class
  on an engine of its model:
  - one of a class that requeues (by default `flex` and `batch`) whose client has seen
    nothing of its answer yet (not streamed, or a stream before its first token), running or
    not: it is aborted on its engine and waits for admission again, within its bound
    counted anew from then (the client sees only the wait; a plain whole answer keeps
    what its engine made and is carried on from there, agents/gateway/gather.py; any other
    loses that work). A request gives way at most `YIELDS` times; after that it runs to
    its end, so that sustained higher-class load cannot keep it from finishing (a
    gathered answer too: each time it gives way costs its engine the prefill of its
    answer so far, and higher-class traffic could take it again and again);
  - where the route's classes turn preemption on, one of any lower class that its engine
    has not started: aborted there and answered 503 `preempted` with Retry-After.

  The one taken is on the worker the request would go to if one is there, then of the
  lowest class, the newest; once it is gone, the request goes in its place there. A request
  takes one at a time: at most one that is answered 503, and at most `TAKES` in all.
  SGLang's own priority scheduling (agents/engines/contract.py) orders what an engine
  queues; this frees room for the higher class where the engine would not (it preempts for
  its slots, never for its KV pool).
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from meridian_pb.fleet.v1.classes import CLASSES, ClassPolicy, ServiceClass

from agents.router.decision import Ticket

ACTIVE_S = 30.0  # a class's reserve is kept while it has had a request this recently
TAKES = 2  # the most requests one request takes the room of, one at a time
YIELDS = 2  # the most times one request gives way: then it runs to its end (no starvation)
FRONT = 4  # of a tenant's line of a bounded class, those that look for a worker
RATE_S = 5.0  # the window of a rate of admissions
ABORT_AGAIN_S = 0.1  # a request taken and not gone this long after is aborted again
PEAK_S = 30.0  # the time constant over which a class's peak holding fades
WANTED_MAX = 0.9  # of a model's KV pools, the most lower classes are kept from for those above
COUNT = len(CLASSES)
K = TypeVar("K")


@dataclass(slots=True, eq=False)
class Waiter:
    """A request of a model waiting for admission: its tag, whether it fitted at its last
    look, whether it has taken a lower class's room (it goes there once that is free), and
    whether a higher class's request took its place. A request of a class bounded
    by its own wait waits in its tenant's line of that class (`line`: not None), and looks
    for a worker only from its front (`turn` is set when it gets there, or is shed)."""

    service_class: ServiceClass
    tag: float
    ready: bool = False
    taking: bool = False
    shed: bool = False
    line: tuple[ServiceClass, str] | None = None
    turn: asyncio.Event | None = None

    def wake(self) -> None:
        if self.turn is not None:
            self.turn.set()


@dataclass(slots=True, eq=False)
class Victim:
    """A request sent to an engine whose room a higher class may take: its ticket, its class,
    how to stop it (the gateway's abort on the engine), whether it is requeued when taken
    (else answered 503), and whether its client has seen a byte of it."""

    ticket: Ticket
    service_class: ServiceClass
    abort: Callable[[], None]
    requeue: bool = False
    shown: bool = False
    preempted: bool = False  # taken: its room went to a higher class
    gone: bool = False  # its slot was given back: what it held on its engine is free
    taken_at: float = 0.0

    @property
    def requeued(self) -> bool:
        return self.preempted and self.requeue

    def take(self, now: float) -> None:
        """Its room goes to a higher class: it is aborted on its engine."""
        self.preempted, self.taken_at = True, now
        self.abort()

    def again(self, now: float) -> None:
        """Aborted again if still not gone a while after: an abort can reach the engine
        before the request it names does (each goes on a connection of its own), and the
        engine then runs it whole."""
        if self.preempted and not self.gone and now - self.taken_at >= ABORT_AGAIN_S:
            self.taken_at = now
            self.abort()


def victim_for(
    running: Iterable[Victim], service_class: ServiceClass, worker_id: str, unstarted: bool
) -> Victim | None:
    """The request a request of `service_class` bound for `worker_id` may take the room of:
    of a lower class, one that requeues and whose client has seen nothing, or (`unstarted`:
    the route preempts) one its engine has not started; on that worker first, then of the
    lowest class, the newest. None if none. Pure."""
    best: Victim | None = None
    best_key = (False, 0, 0.0)
    for victim in running:
        ticket = victim.ticket
        if victim.service_class <= service_class or victim.preempted or ticket.done:
            continue
        if not (victim.requeue and not victim.shown) and not (
            unstarted and ticket.first_at is None
        ):
            continue
        key = (ticket.worker_id == worker_id, int(victim.service_class), ticket.sent_at)
        if best is None or key > best_key:
            best, best_key = victim, key
    return best


@dataclass(slots=True)
class Rate:
    """Events a second: an exponentially weighted count over RATE_S."""

    per_s: float = 0.0
    at: float = 0.0

    def add(self, now: float) -> None:
        self.per_s, self.at = self.current(now) + 1 / RATE_S, now

    def current(self, now: float) -> float:
        return self.per_s * math.exp(-(now - self.at) / RATE_S)


def tally(rates: dict[K, Rate], key: K, now: float) -> None:
    """One more event of `key`'s rate."""
    rate = rates.get(key)
    if rate is None:
        rate = rates[key] = Rate(at=now)
    rate.add(now)


@dataclass(slots=True)
class Holding:
    """The KV room one model's requests in flight from this gateway will hold at their ends
    (uncached prompt and expected answer), by class, and each class's recent peak of it
    (fading over PEAK_S). What a class held at its peak and does not hold now is room it is
    likely to want back within a lower class's answer: a lower class does not take it (the
    engines cannot take KV room back: they preempt for slots only)."""

    held: list[float] = field(default_factory=lambda: [0.0] * COUNT)
    peak: list[float] = field(default_factory=lambda: [0.0] * COUNT)
    at: list[float] = field(default_factory=lambda: [0.0] * COUNT)

    def add(self, service_class: int, tokens: float, now: float) -> None:
        held = self.held[service_class] = self.held[service_class] + tokens
        if held >= self.peak_of(service_class, now):
            self.peak[service_class], self.at[service_class] = held, now

    def remove(self, service_class: int, tokens: float) -> None:
        self.held[service_class] = max(0.0, self.held[service_class] - tokens)

    def peak_of(self, service_class: int, now: float) -> float:
        faded = self.peak[service_class] * math.exp(-(now - self.at[service_class]) / PEAK_S)
        return max(self.held[service_class], faded)

    def wanted(self, service_class: int, now: float) -> float:
        """Room the classes above `service_class` held at their recent peaks and do not
        hold now (tokens)."""
        return sum(self.peak_of(above, now) - self.held[above] for above in range(service_class))


@dataclass(slots=True)
class ModelClasses:
    """One model's classes in admission."""

    vtime: float = 0.0
    last: list[float] = field(default_factory=lambda: [0.0] * COUNT)
    waiting: list[dict[int, Waiter]] = field(default_factory=lambda: [{} for _ in CLASSES])
    seen_at: list[float] = field(default_factory=lambda: [-ACTIVE_S] * COUNT)
    count: int = 0  # requests waiting, all classes
    # bounded classes' waiting requests, by class and tenant, in the order they came
    lines: dict[tuple[ServiceClass, str], dict[int, Waiter]] = field(default_factory=dict)
    admitted: dict[tuple[ServiceClass, str], Rate] = field(default_factory=dict)  # by line


class ClassQueues:
    """Every model's classes in admission, on this gateway."""

    def __init__(self) -> None:
        self.models: dict[str, ModelClasses] = {}

    def of(self, model: str) -> ModelClasses:
        found = self.models.get(model)
        if found is None:
            found = self.models[model] = ModelClasses()
        return found

    def arrived(self, model: str, service_class: ServiceClass, now: float) -> None:
        """A request of the class arrived for the model: its reserve is kept for a while."""
        self.of(model).seen_at[service_class] = now

    def tag(self, model: str, service_class: ServiceClass, policy: ClassPolicy) -> float:
        """The start tag a request of the class takes now (not yet recorded)."""
        state = self.of(model)
        weight = policy.rule(service_class).weight
        return max(state.vtime, state.last[service_class]) + 1.0 / weight

    def wait(self, model: str, waiter: Waiter) -> None:
        """It joins the model's waiting requests, with its tag (and its line)."""
        state = self.of(model)
        state.last[waiter.service_class] = max(state.last[waiter.service_class], waiter.tag)
        state.waiting[waiter.service_class][id(waiter)] = waiter
        state.count += 1
        if waiter.line is not None:
            state.lines.setdefault(waiter.line, {})[id(waiter)] = waiter

    def in_front(self, model: str, waiter: Waiter) -> bool:
        """It is among the first FRONT of its line (a request with no line always is): it
        looks for a worker. Those behind wait for their turn: a flood of batch requests
        costs the gateway what FRONT of each tenant's cost, not each one's, at every look."""
        state = self.models.get(model)
        if waiter.line is None or state is None:
            return True
        line = state.lines.get(waiter.line, {})
        return any(w is waiter for w in itertools.islice(line.values(), FRONT))

    def admitted(self, model: str, line: tuple[ServiceClass, str], now: float) -> None:
        """A request of the line (a bounded class's, a tenant's) was admitted."""
        tally(self.of(model).admitted, line, now)

    def hopeless(
        self, model: str, line: tuple[ServiceClass, str], bound: float, now: float
    ) -> int | None:
        """How many wait in the line, if a request that joins it now would most likely not
        be admitted within `bound`: as many wait as the line has had admitted over `bound`
        at its recent rate, and at least FRONT (a line with no admissions lately takes its
        front: some must look for a worker to be admitted at all). Those ahead go first,
        or leave at their bounds just before it. None if it may join."""
        state = self.models.get(model)
        if state is None:
            return None
        waiting = len(state.lines.get(line, ()))
        if waiting < FRONT:
            return None
        rate = state.admitted.get(line)
        per_s = rate.current(now) if rate is not None else 0.0
        return waiting if waiting >= per_s * bound else None

    def left(self, model: str, waiter: Waiter) -> None:
        """It leaves the waiting requests (admitted, refused or gone); the next in its line
        gets its turn."""
        state = self.models.get(model)
        if state is None or state.waiting[waiter.service_class].pop(id(waiter), None) is None:
            return
        if waiter.line is not None:
            line = state.lines.get(waiter.line, {})
            line.pop(id(waiter), None)
            if not line:
                state.lines.pop(waiter.line, None)
            for front in itertools.islice(line.values(), FRONT):
                front.wake()
        state.count -= 1
        if not state.count:  # nothing waits: the tags start again
            state.vtime = 0.0
            state.last = [0.0] * COUNT

    def served(self, model: str, service_class: ServiceClass, tag: float | None) -> None:
        """A request was admitted while others waited: virtual time moves to its tag."""
        state = self.models.get(model)
        if state is None or tag is None:
            return
        state.vtime = max(state.vtime, tag)
        state.last[service_class] = max(state.last[service_class], tag)

    def behind(self, model: str, service_class: ServiceClass, tag: float) -> bool:
        """A request of another class, tagged earlier, waits and fitted at its last look, or
        one of a higher class has taken room (the request that gave it way, requeued, must
        not take it back): it goes first. Not one behind the front of its line: it does not
        look until its turn, and what it saw at its last look (maybe seconds ago, as it
        joined) holds nobody back."""
        state = self.models.get(model)
        if state is None or not state.count:
            return False
        for index, waiting in enumerate(state.waiting):
            if index == service_class or not waiting:
                continue
            for other in waiting.values():  # in the order they came: their tags rise
                if other.tag >= tag:
                    break
                first = other.ready or (other.taking and index < service_class)
                looks = other.line is None or self.in_front(model, other)
                if first and looks and not other.shed:
                    return True
        return False

    def shed_for(self, model: str, service_class: ServiceClass) -> Waiter | None:
        """The newest waiting request of the lowest class below `service_class`, marked shed
        (it is refused at its next look); None when none waits below it."""
        state = self.models.get(model)
        if state is None:
            return None
        for index in range(COUNT - 1, service_class, -1):
            for waiter in reversed(state.waiting[index].values()):
                if not waiter.shed:
                    waiter.shed = True
                    waiter.wake()  # it hears it at once, in its line or not
                    return waiter
        return None

    def kept(
        self,
        model: str,
        service_class: ServiceClass,
        policy: ClassPolicy,
        now: float,
        escalated: bool,
    ) -> float:
        """The share of each worker's KV pool this request may not take: the reserves of the
        classes above it that have had a request lately (a peer's request never takes the
        reserve of interactive traffic here)."""
        if escalated and service_class < ServiceClass.STANDARD:
            service_class = ServiceClass.STANDARD
        if service_class == ServiceClass.INTERACTIVE:
            return 0.0
        state = self.models.get(model)
        seen = state.seen_at if state is not None else None
        kept = 0.0
        for above, reserve in policy.reserved_above(service_class):
            recent = seen is not None and now - seen[above] < ACTIVE_S
            if recent or (escalated and above == ServiceClass.INTERACTIVE):
                kept += reserve
        return kept

    def waiting_of(self, model: str) -> list[int]:
        """Requests waiting for the model, by class."""
        state = self.models.get(model)
        return [len(w) for w in state.waiting] if state is not None else [0] * COUNT
