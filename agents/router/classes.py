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
  traffic.
- **Slack.** A class with a `max_wait_s` (by default `flex` and `batch`) is admitted against
  a share of the route's TTFT SLO, its wait not counted: it runs where an engine would start
  it that soon, on capacity the classes above leave, and waits up to its bound for it.
- **Shedding.** A request that finds its model's queue full takes the place of the newest
  waiting request of the lowest class below its own, which is refused 429 `class_shed`.
- **Preemption** (where the route's classes turn it on). A request that would wait may take
  the place of a request of a lower class that an engine of its model has been sent and has
  not started: the newest of the lowest class. That one is aborted on its engine and
  answered 503 `preempted` with Retry-After; it has not sent a byte to its client. One
  request preempts at most one other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from meridian_pb.fleet.v1.classes import CLASSES, ClassPolicy, ServiceClass

from agents.router.decision import Ticket

ACTIVE_S = 30.0  # a class's reserve is kept while it has had a request this recently
COUNT = len(CLASSES)


@dataclass(slots=True, eq=False)
class Waiter:
    """A request of a model waiting for admission: its tag, whether it fitted at its last
    look, and whether a higher class's request took its place."""

    service_class: ServiceClass
    tag: float
    ready: bool = False
    shed: bool = False


@dataclass(slots=True, eq=False)
class Victim:
    """A request sent to an engine that a higher class may preempt until it starts there:
    its ticket, its class, and how to stop it (the gateway's abort on the engine)."""

    ticket: Ticket
    service_class: ServiceClass
    abort: Callable[[], None]
    preempted: bool = False


def victim_for(running: Iterable[Victim], service_class: ServiceClass) -> Victim | None:
    """The request a request of `service_class` may preempt: of those of a lower class whose
    engine has not started them, the newest of the lowest class; None if none. Pure."""
    best: Victim | None = None
    for victim in running:
        ticket = victim.ticket
        if (
            victim.service_class <= service_class
            or victim.preempted
            or ticket.first_at is not None
            or ticket.done
        ):
            continue
        if best is None or (victim.service_class, ticket.sent_at) > (
            best.service_class, best.ticket.sent_at,
        ):  # fmt: skip
            best = victim
    return best


@dataclass(slots=True)
class ModelClasses:
    """One model's classes in admission."""

    vtime: float = 0.0
    last: list[float] = field(default_factory=lambda: [0.0] * COUNT)
    waiting: list[dict[int, Waiter]] = field(default_factory=lambda: [{} for _ in CLASSES])
    seen_at: list[float] = field(default_factory=lambda: [-ACTIVE_S] * COUNT)
    count: int = 0  # requests waiting, all classes


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
        """It joins the model's waiting requests, with its tag."""
        state = self.of(model)
        state.last[waiter.service_class] = max(state.last[waiter.service_class], waiter.tag)
        state.waiting[waiter.service_class][id(waiter)] = waiter
        state.count += 1

    def left(self, model: str, waiter: Waiter) -> None:
        """It leaves the waiting requests (admitted, refused or gone)."""
        state = self.models.get(model)
        if state is None or state.waiting[waiter.service_class].pop(id(waiter), None) is None:
            return
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
        """A request of another class, tagged earlier, waits and fitted at its last look:
        it goes first."""
        state = self.models.get(model)
        if state is None or not state.count:
            return False
        for index, waiting in enumerate(state.waiting):
            if index == service_class or not waiting:
                continue
            for other in waiting.values():  # in the order they came: their tags rise
                if other.tag >= tag:
                    break
                if other.ready and not other.shed:
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
