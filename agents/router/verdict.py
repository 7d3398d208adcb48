"""Admission's verdict on one look at a waiting request: admitted, sent to a peer, refused,
or left to wait. Pure: what admission saw (`Look`) in, the plan out
(agents/router/admission.py takes the looks)."""

from __future__ import annotations

from dataclasses import dataclass

from agents.router.decision import Decision
from agents.router.plan import Call, Over, Peer, Reason, Refusal, Reject, call, overloaded

DEFAULT_WAIT_S = 10.0  # the longest wait of a model without an SLO
WAKE_RETRY_S = 10  # Retry-After when none started within the wait


@dataclass(slots=True)  # made at every look: not frozen (a frozen one costs more to make)
class Look:
    """What admission sees of a request at one look: the input of `judge`."""

    model: str
    tenant: str
    decision: Decision
    fits: bool  # the best worker can start it within the SLO (`fits`)
    wait_s: float | None  # the wait for a first byte predicted there, when `fits` ran
    standing: int  # the tenant's, on the model: -1 under its fair share, 1 over it, 0 even
    under_waiting: bool  # a tenant under its share waits for the model
    waiting: int  # requests of the model waiting here
    ahead_s: float  # a request about to queue: how long those ahead of it take to go
    waited_s: float  # since its SLO clock started
    left_s: float  # until its SLO passes (or the wait of a model without one)
    queued: bool  # it waits here already
    queue: Reject | None  # what a full queue says to it, when it is not queued yet
    limits: Over | None  # the rule's overload thresholds, when they apply
    tried: int  # workers that failed it
    slo_s: float | None
    continuing: bool = False
    waking_s: float | None = None  # no engine may run here, and no peer takes it: the wait
    behind: bool = False  # a request of another class goes first (fair queueing)
    bound_s: float | None = None  # its class's bound on its wait (None: the SLO is)
    service_class: str = "standard"


def admits(decision: Decision, fit: bool, standing: int, under_waiting: bool) -> bool:
    """The best worker can start it within the SLO, and its tenant, if over its fair share,
    does not go before one under its share that waits. Pure."""
    return bool(decision.ranked) and fit and not (standing > 0 and under_waiting)


def judge(look: Look) -> Call | Peer | Reject | None:
    """Admitted (the call to make), sent to a peer, refused, or None: it waits. Pure."""
    decision = look.decision
    late = look.bound_s is not None and look.left_s < 0  # never admitted past its own bound
    admitted = admits(decision, look.fits, look.standing, look.under_waiting)
    if admitted and not look.behind and not late:
        return call(decision, look.continuing, look.wait_s)
    if not decision.ranked and not decision.vetoed:
        if look.waking_s is not None and not look.tried:
            if look.waited_s < look.waking_s:
                return None  # it waits for an engine to start (the planner counts it)
            return Reject(
                Refusal.NO_HEALTHY_WORKER,
                f"no engine of {look.model} runs here, and none started within "
                f"{look.waking_s:.0f} s; one is starting",
                WAKE_RETRY_S,
                Reason.NO_WORKER,
            )
        failed = f"{look.tried} failed it, " if look.tried else ""
        return Reject(
            Refusal.NO_HEALTHY_WORKER,
            f"no worker of {look.model} is serving "
            f"({failed}{decision.unavailable} of {decision.total} unavailable)",
            2,
            Reason.NO_WORKER,
        )
    if look.limits is not None:
        waited = look.waited_s + (0.0 if look.queued else look.ahead_s)
        peer = overloaded(look.limits, decision, look.waiting, waited, look.queued, look.wait_s)
        if peer is not None:
            return peer
    if not look.queued and look.queue is not None:
        return look.queue
    if look.left_s <= 0:
        retry = retry_s(look.slo_s)
        if look.bound_s is not None:
            return Reject(
                Refusal.OVERLOADED,
                f"{look.model} had no room for a {look.service_class} request within "
                f"{look.bound_s:g} s",
                max(retry, round(min(look.bound_s, 60.0))),
                Reason.OVERLOADED,
            )
        if look.standing > 0:
            return Reject(
                Refusal.TENANT_SHARE,
                f"{look.model} is saturated here and tenant {look.tenant} holds more than its "
                "fair share of it; others' requests go first",
                retry,
                Reason.TENANT_SHARE,
            )
        return Reject(
            Refusal.OVERLOADED,
            f"no worker of {look.model} could start it within "
            f"{(look.slo_s or DEFAULT_WAIT_S) * 1000:.0f} ms",
            retry,
            Reason.OVERLOADED,
        )
    return None


def retry_s(slo: float | None) -> int:
    return max(1, round(slo if slo is not None else 1))
