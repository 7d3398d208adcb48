"""The router's plan for one request: where it goes next, decided in one place.

The gateway asks `Router.plan` each time a request needs somewhere to go (on arrival, after a
worker failed it, after its stream broke off) and carries the plan out, I/O only:

- `Local(decision)`: call the chosen worker here;
- `Pair(decision, prefill)`: a PD pair here, the prompt prefilled on `prefill`;
- `Continue(decision, prefill)`: a cut stream's rest, from a worker here;
- `Peer(trigger, reason, why, otherwise)`: send it to a peer region under the tenant's
  fallback rule; if no peer takes it, `otherwise` (a refusal), or, when that is None, plan
  again without that escalation (it waits here, as it would without a rule);
- `MoveTier(tier, placement, then, why)`: a tiered request whose tier would break its SLO
  moves to `tier`, and `then` is carried out there;
- `Reject(code, message, retry_after_s)`: refused (a started stream ends with it instead).

What arrived (`Ask`), where it is going (`Placement`, replaced whole when its tier changes)
and how it has fared (`Progress`) are the plan's inputs. The decisions below are pure
functions of them and of what admission sees (`agents/router/admission.py`), tested over a
table of situations: every trigger (the failure rate, thresholds, attempts, the one-hop rule,
the operator rule, tier capacity moves, migration) is here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from meridian_pb.fleet.v1.classes import ServiceClass

from agents.config import FallbackChain, RouteConfig
from agents.router.decision import Decision
from agents.router.policies import Candidate, RouteRequest

MAX_ATTEMPTS = 3  # workers tried before the client has seen a byte
MAX_MIGRATIONS = 2  # a started stream carried on elsewhere, at most this often
POISONED_AFTER = 2  # workers broken by one request: it is taken to be the cause, and stops


class Trigger(StrEnum):
    """What a fallback rule escalates on."""

    OVERLOAD = "overload"
    FAILURE = "failure"


class Reason(StrEnum):
    """Why a request goes to a peer, or is refused."""

    FAILING = "failing"  # local attempts fail past the rule's rate
    ATTEMPTS = "attempts"  # MAX_ATTEMPTS workers failed it
    POISONED = "poisoned"  # it broke POISONED_AFTER workers that were serving others
    MIGRATIONS = "migrations"  # its stream was carried on MAX_MIGRATIONS times already
    NO_WORKER = "no_worker"  # no worker of the model serves
    BUSY = "busy"  # every worker is busy or vetoed
    QUEUE_DEPTH = "queue_depth"  # past the rule's queue depth
    PREDICTED_TTFT = "predicted_ttft"  # past the rule's TTFT, as predicted here
    QUEUE_FULL = "queue_full"
    TENANT_SHARE = "tenant_share"  # saturated, and the tenant is over its fair share
    OVERLOADED = "overloaded"  # its SLO passed while it waited


class Refusal(StrEnum):
    """A refusal's stable code (the gateway's error of the same code answers it)."""

    QUEUE_FULL = "queue_full"
    OVERLOADED = "overloaded"
    TENANT_SHARE = "tenant_share"
    NO_HEALTHY_WORKER = "no_healthy_worker"
    UPSTREAM_FAILED = "upstream_failed"
    CLASS_SHED = "class_shed"  # a higher class's request took its place in a full queue


class Ask(NamedTuple):
    """What arrived, as the router reads it. Immutable (a tuple: cheap to make on every
    request)."""

    id: str
    tenant: str
    came_from: str | None = None  # the peer region that escalated it here (one hop)
    operator: bool = False  # the operator's own request: never escalated
    service_class: ServiceClass = ServiceClass.STANDARD  # served at, clamped to its ceiling


class Placement(NamedTuple):
    """Where the request is going: its model's route here, the request as the router takes
    it for that model, the tenant's fallback rule for it, and its tier (a tiered route's).
    Immutable: a tier change replaces it whole."""

    model: str
    route: RouteConfig
    request: RouteRequest
    chain: FallbackChain | None
    tier: int | None = None


@dataclass(eq=False, slots=True)
class Attempt:
    """One worker's (or peer's) go at the request, and how it ended: what its receipt, its
    metrics and its span say of it (the gateway writes it as it makes the call)."""

    by: str  # the worker id, or peer:<region>
    ended: str = ""  # why it failed ("" while it runs, or when it answered)
    policy: str = ""  # the routing policy, or "escalation"
    reason: str = ""  # the router's reason, or the escalation's
    routed_prompt: int = 0  # the prompt's tokens as the router took them
    routed_cached: int = 0  # of them, those it expected cached there
    load: float = 0.0  # requests of its model here per serving worker, when sent
    attributes: dict[str, object] | None = None  # the span's, of the decision (a kept trace)


@dataclass(eq=False, slots=True)
class Progress:
    """How the request has fared: written by the gateway as it carries plans out."""

    since: float  # the SLO clock's start: earlier for a peer's request, later after a retry
    attempts: list[Attempt] = field(default_factory=list)
    tried: set[str] = field(default_factory=set)  # workers not to try again
    failures: int = 0  # workers that failed it before the client saw a byte of theirs
    broken: int = 0  # workers that broke off with it in hand, while serving others
    cuts: int = 0  # times its stream broke off after the client saw part of it
    continuing: bool = False  # the client has seen part of the answer
    declined: set[Reason] = field(default_factory=set)  # escalations no peer took
    # it waited (or its model was full) while another tenant held well over its fair share of
    # the model here: what it met was that tenant's load (a rollout's checks leave it out)
    crowded: bool = False
    admitted_at: float | None = None  # when admission first sent it to a worker here
    yields: int = 0  # times it gave way to a higher class (it waited again each time)

    def attempt(self, by: str) -> Attempt:
        attempt = Attempt(by)
        self.attempts.append(attempt)
        return attempt

    def failed(self, worker: str, why: str, broke: bool, now: float) -> None:
        """A worker failed it before the client saw a byte of its answer."""
        self.attempts[-1].ended = why
        self.tried.add(worker)
        self.failures += 1
        self.broken += broke
        self.since = now  # time lost to a failed worker is not the load's

    def gave_way(self, now: float) -> None:
        """Its room on a worker went to a higher class before the client saw a byte: it
        waits for admission again, its wait bounded anew from now (what it ran there was
        work done for the higher class's sake, not its own wait)."""
        self.attempts[-1].ended = "gave way to a higher class"
        self.yields += 1
        self.since = now

    def cut(self, worker: str, why: str, now: float) -> None:
        """Its stream broke off at `worker` after the client saw part of it."""
        self.attempts[-1].ended = why
        self.tried.add(worker)
        self.cuts += 1
        self.failures = 0  # the continuation has its own tries
        self.since = now


@dataclass(frozen=True, slots=True)
class Tiering:
    """A tiered request's tiers to try under load: the one it is on, the order to try them
    in (agents/gateway/tiers.py), and each one's placement (None: it does not fit there)."""

    current: int
    order: tuple[int, ...]
    placement: Callable[[int], Placement | None]


@dataclass(frozen=True, slots=True)
class Local:
    decision: Decision
    wait_s: float | None = None  # the wait for a first byte admission predicted there


@dataclass(frozen=True, slots=True)
class Pair:
    decision: Decision
    prefill: Candidate
    wait_s: float | None = None


@dataclass(frozen=True, slots=True)
class Continue:
    decision: Decision
    prefill: Candidate | None = None
    wait_s: float | None = None


@dataclass(frozen=True, slots=True)
class Reject:
    code: Refusal
    message: str
    retry_after_s: int | None = None
    reason: Reason | None = None


@dataclass(frozen=True, slots=True)
class Peer:
    trigger: Trigger
    reason: Reason
    why: str
    otherwise: Reject | None = None  # when no peer takes it; None: plan again, here


Call = Local | Pair | Continue


@dataclass(frozen=True, slots=True)
class MoveTier:
    tier: int
    placement: Placement
    then: Call
    why: str


Plan = Local | Pair | Continue | Peer | MoveTier | Reject


def call(decision: Decision, continuing: bool, wait_s: float | None) -> Call:
    """The admitted decision as the call to make: a cut stream's rest, a PD pair, or one
    worker."""
    if continuing:
        return Continue(decision, decision.prefill, wait_s)
    if decision.prefill is not None:
        return Pair(decision, decision.prefill, wait_s)
    return Local(decision, wait_s)


def escalates(ask: Ask, chain: FallbackChain | None) -> bool:
    """The request may go to a peer at all: a rule (`chain`) applies, it did not come from a
    peer (one hop), and it is not the operator's (not a tenant's to assert)."""
    return chain is not None and ask.came_from is None and not ask.operator


def fails_over(ask: Ask, placement: Placement, progress: Progress) -> bool:
    """A failure here may send it to a peer: the rule says so, or its answer has begun (a
    started answer goes on, where any rule allows)."""
    chain = placement.chain
    return (
        escalates(ask, chain)
        and chain is not None
        and (Trigger.FAILURE in chain.triggers or progress.continuing)
    )


def overload_escalates(ask: Ask, chain: FallbackChain | None) -> bool:
    """Overload here may send it to a peer: the rule (`chain`) says so."""
    return escalates(ask, chain) and chain is not None and Trigger.OVERLOAD in chain.triggers


def refused(ask: Ask, placement: Placement, progress: Progress, reject: Reject) -> Plan:
    """A refusal here, sent to a peer first where the rule's trigger covers it."""
    reason = reject.reason
    if reject.code is Refusal.NO_HEALTHY_WORKER or reason is Reason.ATTEMPTS:
        if fails_over(ask, placement, progress):
            return Peer(Trigger.FAILURE, reason or Reason.NO_WORKER, reject.message, reject)
        return reject
    if reject.code in OVERLOAD_REFUSALS and overload_escalates(ask, placement.chain):
        return Peer(Trigger.OVERLOAD, reason or Reason.OVERLOADED, reject.message, reject)
    return reject


OVERLOAD_REFUSALS = frozenset({Refusal.QUEUE_FULL, Refusal.OVERLOADED, Refusal.TENANT_SHARE})
PREDICTIVE = frozenset({Reason.BUSY, Reason.QUEUE_DEPTH, Reason.PREDICTED_TTFT})  # before waiting


def before_placing(
    ask: Ask, placement: Placement, progress: Progress, failing: bool
) -> Plan | None:
    """What is decided before a worker is looked for: a request that broke workers, ran out
    of attempts or of migrations stops (or goes to a peer); one whose model fails here past
    the rule's rate goes to a peer first. `failing`: local attempts of the model fail past
    the rule's rate (agents/router/escalation.py)."""
    if progress.broken >= POISONED_AFTER:  # the request, not the workers: it goes no further
        return Reject(
            Refusal.UPSTREAM_FAILED,
            f"the request broke {progress.broken} workers that were serving others; "
            "it is not tried again",
            reason=Reason.POISONED,
        )
    if progress.cuts > MAX_MIGRATIONS:
        return Reject(
            Refusal.UPSTREAM_FAILED,
            f"it was carried on {MAX_MIGRATIONS} times already",
            reason=Reason.MIGRATIONS,
        )
    if progress.failures >= MAX_ATTEMPTS:
        failed = Reject(
            Refusal.UPSTREAM_FAILED,
            f"{MAX_ATTEMPTS} workers failed the request",
            1,
            Reason.ATTEMPTS,
        )
        return refused(ask, placement, progress, failed)
    chain = placement.chain
    if (
        failing
        and not progress.attempts
        and Reason.FAILING not in progress.declined
        and chain is not None
        and Trigger.FAILURE in chain.triggers
        and escalates(ask, chain)
    ):
        return Peer(Trigger.FAILURE, Reason.FAILING, "local attempts fail past the rule's rate")
    return None


@dataclass(frozen=True, slots=True)
class Over:
    """Past these, a request of a model with a fallback rule escalates instead of waiting."""

    ttft_s: float | None  # its predicted TTFT here, counting what it has waited
    queue_depth: int | None  # requests of the model waiting here


def over(ask: Ask, placement: Placement, progress: Progress) -> Over | None:
    """The rule's overload thresholds, for a request's first placement (not after a failed
    attempt, nor once no peer took it)."""
    chain = placement.chain
    if (
        chain is None
        or progress.attempts
        or progress.declined & PREDICTIVE
        or not overload_escalates(ask, chain)
    ):
        return None
    return Over(chain.ttft_s or placement.route.slo_ttft_s, chain.queue_depth)


def overloaded(
    limits: Over, decision: Decision, waiting: int, waited_s: float, queued: bool,
    wait_s: float | None,
) -> Peer | None:  # fmt: skip
    """Past the rule's overload thresholds: to a peer before it waits here (and, if none
    takes it, it waits here as it would without a rule). `wait_s`: the wait admission
    predicted at the best worker, else the policy's."""
    if not decision.ranked:
        return Peer(Trigger.OVERLOAD, Reason.BUSY, "every worker of the model is busy or vetoed")
    if limits.queue_depth is not None and not queued and waiting >= limits.queue_depth:
        why = f"{waiting} requests of the model wait here"
        return Peer(Trigger.OVERLOAD, Reason.QUEUE_DEPTH, why)
    # the wait admission predicted there (with the engine's room and queue), else the policy's;
    # not scaled up by how late first bytes lately came, as admission's is: that guards the
    # SLO of what is admitted, and would send requests away that wait here in time
    predicted = wait_s if wait_s is not None else decision.best_ttft_s
    if limits.ttft_s is not None and predicted is not None and predicted + waited_s > limits.ttft_s:
        why = f"predicted TTFT here {(predicted + waited_s) * 1000:.0f} ms"
        return Peer(Trigger.OVERLOAD, Reason.PREDICTED_TTFT, why)
    return None


def moved_tier(
    tiering: Tiering, start: int, index: int, placement: Placement, then: Call, full: list[str]
) -> Plan:
    """A tier's placement that admits it: on its own tier, the call itself; on another, a
    move there, saying why."""
    if index == start:
        return then
    way = "down" if index < start else "up"
    return MoveTier(index, placement, then, f"moved {way}: {'; '.join(full)}")


def describe(plan: Plan) -> str:
    """One line for a log."""
    match plan:
        case Local(decision) | Pair(decision) | Continue(decision):
            worker = decision.ranked[0].worker.id if decision.ranked else None
            return f"{type(plan).__name__.lower()} {worker}"
        case Peer(trigger, reason, why):
            return f"peer ({trigger}, {reason}: {why})"
        case MoveTier(tier, _, then, why):
            return f"tier {tier} ({why}), then {describe(then)}"
        case Reject(code, message):
            return f"reject {code}: {message}"
