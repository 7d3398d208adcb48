"""Admission: a request waits, bounded, for a worker that can take it within the SLO.

Per model at most `max_queue` requests wait; one more is answered 429 with Retry-After at
once. A waiting request is re-placed whenever a request of its model moves on (first byte,
end) or a load poll lands; it is admitted when the best worker's predicted TTFT plus what it
has waited fits the SLO, and answered 429 when its SLO has passed in the queue. A model with
no worker serving at all is answered 503 with Retry-After, unless it may run no engine here
(its deployment scales to zero) and no peer takes the request: then it waits for an engine
to start, up to the route's `wake_wait_s`, and its SLO runs from when one serves. Nothing
waits without bound.

A request waits at least as long as the oldest one sent to its worker that has not started
there, and as the requests the engine holds back take to start: requests queue here, where
they can be shed when their SLO passes, not in an engine's queue, where they cannot.

Fair between tenants. Every request of a model holds a place of its tenant's (from its
admission until it ends, `hold`); a tenant's fair share of the model here is the places held,
in proportion to the weights of the tenants holding any. While tenants hold unequally
(one is over its share):

- a tenant under its share is admitted on the room the engine itself would give it (SGLang
  keeps room for a share of each running answer's rest, `RESERVE_RATIO`), not on room for
  every answer there to finish: another tenant's long answers, reserved in full, would
  otherwise shut it out for minutes, and should room run short it is theirs the engine
  retracts first;
- a tenant over its share is not admitted while one under its share waits for the model:
  freed room goes to the one under first; past its SLO it is refused 429 `tenant_share`;
- when the queue is full, a tenant under its share may still queue up to its share of it;
  one over its share is refused `tenant_share`.

A tenant alone, or tenants holding alike, are admitted as before: fairness costs nothing
until it has something to decide.

A request that waited (or came while the model was full) while another tenant held well
over its fair share is marked `crowded`: what it met was that tenant's load, and a
rollout's checks leave it out (its refusal is counted as "crowded", its first token's time
apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from meridian_pb.fleet.v1.classes import ServiceClass

from agents.config import FallbackChain, RouteConfig, Tenant
from agents.router import predict
from agents.router.classes import (
    RATE_S,
    TAKES,
    WANTED_MAX,
    ClassQueues,
    Rate,
    Victim,
    Waiter,
    tally,
    victim_for,
)
from agents.router.decision import Decision
from agents.router.fairness import Fairness, Places
from agents.router.plan import (
    Ask,
    Call,
    Over,
    Peer,
    Placement,
    Plan,
    Progress,
    Reason,
    Refusal,
    Reject,
    Tiering,
    call,
    fails_over,
    moved_tier,
    overload_escalates,
)
from agents.router.verdict import DEFAULT_WAIT_S, Look, admits, judge, retry_s
from agents.router.view import RESERVE_RATIO

if TYPE_CHECKING:
    from agents.router.router import Router

RECHECK_S = 0.05  # a waiting request is placed again at least this often
FULL_S = 5.0  # a model is full for this long after a request of it last had to wait
DEADLINE = frozenset({Reason.OVERLOADED, Reason.TENANT_SHARE})  # refused once its SLO passed
WAKE_RECHECK_S = 0.25  # a request waiting for an engine to start looks again this often


class Admission:
    def __init__(self, router: Router, clock: Callable[[], float] = time.monotonic) -> None:
        self.router = router
        self.clock = clock
        self.fair = Fairness()
        self.classes = ClassQueues()
        self.running: dict[str, dict[int, Victim]] = {}  # model: requests a class may preempt
        self.waiting: dict[str, int] = {}
        self._full_at: dict[str, float] = {}
        self._events: dict[str, asyncio.Event] = {}
        self._rates: dict[str, Rate] = {}  # model: its admissions a second

    def notify(self, model: str) -> None:
        event = self._events.pop(model, None)
        if event is not None:
            event.set()

    def notify_all(self) -> None:
        for model in list(self._events):
            self.notify(model)

    def _drain_s(self, model: str, waiting: int, now: float) -> float:
        """How long the requests waiting for the model take to be admitted, at the rate they
        lately have been (Little's law); not known (0) without admissions lately."""
        found = self._rates.get(model)
        rate = found.current(now) if found is not None else 0.0
        return waiting / rate if waiting and rate > 1 / RATE_S else 0.0

    def on_arrival(
        self, ask: Ask, route: RouteConfig, chain: FallbackChain | None
    ) -> Reject | None:
        """A request of a class bounded by its own wait, refused as it arrives where its
        tenant's line of that class is hopeless (classes.ClassQueues.hopeless): before it is
        tokenized and placed, which a flood of such requests would make cost the gateway's
        loop more than all it serves; its client hears now what it would hear at its bound.
        Never one the rule (`chain`) sends to a peer when overloaded here."""
        served, model = ask.service_class, route.model
        bound = route.classes.rule(served).max_wait_s
        if bound is None or overload_escalates(ask, chain):
            return None
        now = self.clock()
        self.classes.arrived(model, served, now)
        waiting = self.classes.hopeless(model, (served, ask.tenant), bound, now)
        if waiting is None:
            return None
        return Reject(
            Refusal.OVERLOADED,
            f"{waiting} {served.label} requests of tenant {ask.tenant} wait for {model} here, "
            f"as many as it has lately admitted of them within {bound:g} s",
            max(retry_s(route.slo_ttft_s), round(min(bound, 60.0))),
            Reason.OVERLOADED,
        )

    def enlist(self, model: str, victim: Victim) -> None:
        """A request sent to an engine whose room a higher class may take (classes.py)."""
        self.running.setdefault(model, {})[id(victim)] = victim

    def discharge(self, model: str, victim: Victim) -> None:
        victim.gone = True
        running = self.running.get(model)
        if running is not None:
            running.pop(id(victim), None)

    def _wanted(self, model: str, served: ServiceClass, decision: Decision, now: float) -> float:
        """The share of the model's KV pools here that the classes above `served` held at
        their recent peaks and do not hold now (classes.Holding): room they are likely to
        want back while this request's answer runs, which it does not take."""
        wanted = self.router.holding(model).wanted(served, now)
        if wanted <= 0:
            return 0.0
        pool = sum(c.entry.load.max_total_tokens for c in decision.ranked)
        return min(WANTED_MAX, wanted / pool) if pool > 0 else 0.0

    def hold(self, model: str, tenant: Tenant) -> Places:
        """The request's place among its tenant's on `model`, held by `with` until it ends."""
        return Places(self.fair, model, tenant)

    async def by_tier(self, ask: Ask, progress: Progress, tiering: Tiering) -> Plan | None:
        """A tiered request whose tier would break its SLO moves to the next tier that would
        not (down to its floor, then up); None when every tier would (it then waits on its
        own tier, is refused or escalates, as any request)."""
        full: list[str] = []
        for index in tiering.order:
            placement = tiering.placement(index)
            if placement is None:
                continue  # a tier it does not fit (its context): not one to move to
            slo = placement.route.slo_ttft_s
            plan = await self.admit(ask, placement, progress, Over(slo, None) if slo else None)
            match plan:
                case Reject(Refusal.OVERLOADED):
                    return plan  # its SLO passed, waiting on a tier: refused
                case Peer(why=why) | Reject(message=why):
                    full.append(f"{placement.model}: {why}")
                case _:
                    return moved_tier(tiering, tiering.current, index, placement, plan, full)
        return None

    async def admit(
        self, ask: Ask, placement: Placement, progress: Progress, limits: Over | None
    ) -> Call | Peer | Reject:
        """Admission: the call to make, or, past `limits`, a peer (before it waits), or a
        refusal. A request that fits here never escalates."""
        route, request, model, tenant = (
            placement.route, placement.request, placement.model, ask.tenant,
        )  # fmt: skip
        slo, since, exclude = route.slo_ttft_s, progress.since, progress.tried
        served, policy, classes = ask.service_class, route.classes, self.classes
        rule = policy.rule(served)
        bound = rule.max_wait_s  # a class bounded by its own wait, admitted on slack
        slack = rule.slack * slo if bound is not None and slo is not None else None
        deadline = since + (bound or (slo if slo is not None else DEFAULT_WAIT_S))
        now = self.clock()
        classes.arrived(model, served, now)
        kept = classes.kept(model, served, policy, now, ask.came_from is not None)
        # a model that may have no engine here waits for one when no peer would take it
        waking = route.wake_wait_s
        if waking is not None and fails_over(ask, placement, progress):
            waking = None
        asleep = False  # it has waited for an engine to start
        queued = False
        waiter: Waiter | None = None
        tag: float | None = None  # its start tag, once others of the model wait
        takes = TAKES if policy.takes_room(served) else 0  # lower classes' room it may take
        taken: Victim | None = None
        fair = self.fair
        try:
            while True:
                if waiter is not None and waiter.shed:
                    return _shed(model, served.label, slo)
                request.full = self.clock() - self._full_at.get(model, -FULL_S) < FULL_S
                decision = self.router.route(route, request, exclude)
                now = self.clock()
                if asleep and decision.ranked:  # an engine started: its SLO runs from now
                    asleep, since = False, now
                    deadline = now + (bound or (slo if slo is not None else DEFAULT_WAIT_S))
                standing = fair.standing(model, tenant)
                ratio = RESERVE_RATIO if standing < 0 else 1.0
                slots = takes > 0 and bool(self.running.get(model))  # room it may take
                room_kept = kept
                if served > ServiceClass.INTERACTIVE and decision.ranked:
                    room_kept = max(kept, self._wanted(model, served, decision, now))
                fit, wait = (
                    predict.fits(decision, route, request, since, now, ratio, kept, slack, slots,
                                 room_kept)
                    if decision.ranked else (False, None)
                )  # fmt: skip
                if not fit and taken is not None and taken.gone and decision.ranked:
                    # it goes in the place of the one that gave way on its best worker: the
                    # engine's load, as last polled, still counts what that one held
                    fit = taken.ticket.worker_id == decision.ranked[0].worker.id
                under = standing > 0 and fair.under_waiting(model, served)
                # a class bounded by its own wait is never admitted past its bound
                ok = admits(decision, fit, standing, under) and not (bound and now > deadline)
                waiting = self.waiting.get(model, 0)
                behind = False
                if ok and waiting:  # others wait: the classes' turns
                    tag = tag if tag is not None else classes.tag(model, served, policy)
                    behind = classes.behind(model, served, tag)
                if waiter is not None:
                    waiter.ready = ok
                if ok and not behind:  # most requests: at the first look
                    tally(self._rates, model, now)
                    if bound:
                        classes.admitted(model, (served, tenant), now)
                    classes.served(model, served, tag)
                    if progress.admitted_at is None:  # its wait is the one judged by its bound
                        progress.admitted_at = now
                    return call(decision, progress.continuing, wait)
                look = Look(
                    model, tenant, decision, fit, wait, standing, under, waiting,
                    0.0 if queued or limits is None else self._drain_s(model, waiting, now),
                    now - since,
                    deadline - now, queued,
                    None if queued else self._queue(route, tenant, standing, served), limits,
                    len(exclude), slo, progress.continuing, waking, behind, bound, served.label,
                )  # fmt: skip
                verdict = judge(look)  # not admitted at this look (`admits` said so above)
                if isinstance(verdict, Peer) or (
                    isinstance(verdict, Reject) and verdict.reason not in DEADLINE
                ):
                    return verdict
                if not queued:  # it waits (or its wait is over: it was one of the waiting)
                    self.waiting[model] = waiting + 1
                    fair.queued(model, tenant, 1, served)
                    queued = True
                    tag = tag if tag is not None else classes.tag(model, served, policy)
                    waiter = Waiter(served, tag, ok, line=(served, tenant) if bound else None)
                    classes.wait(model, waiter)
                self._full_at[model] = now
                if verdict is not None:
                    return verdict
                if taken is not None:
                    taken.again(now)
                if takes and not fit and decision.ranked and (taken is None or taken.gone):
                    best = decision.ranked[0].worker.id
                    taken = victim_for(self.running.get(model, {}).values(), served, best,
                                       policy.preempt)  # fmt: skip
                    if taken is not None:  # it goes in that one's place, once it is gone
                        if waiter is not None:
                            waiter.taking = True
                        # one answered 503 is the one it takes; requeued, up to TAKES
                        takes = takes - 1 if taken.requeue else 0
                        taken.take(now)
                asleep = asleep or not decision.ranked
                pause = WAKE_RECHECK_S if asleep else min(deadline - now, RECHECK_S)
                event = self._events.setdefault(model, asyncio.Event())
                if waiter is not None and not classes.in_front(model, waiter):
                    await self._turn(model, waiter, deadline)  # behind in its line
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), pause)
        finally:
            if queued:
                self.waiting[model] -= 1
                fair.queued(model, tenant, -1, served)
            if waiter is not None:
                classes.left(model, waiter)
                if waiter.ready and self.waiting.get(model):
                    self.notify(model)  # those it held back look again
            if queued or request.full:
                progress.crowded = progress.crowded or fair.crowded(model, tenant)

    async def _turn(self, model: str, waiter: Waiter, deadline: float) -> None:
        """Until the waiter is at the front of its line, shed, or at its deadline: it does
        not look for a worker meanwhile."""
        while not self.classes.in_front(model, waiter) and not waiter.shed:
            left = deadline - self.clock()
            if left <= 0:
                return
            waiter.turn = turn = asyncio.Event()
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(turn.wait(), left)
            finally:
                waiter.turn = None

    def _queue(
        self, route: RouteConfig, tenant: str, standing: int, served: ServiceClass
    ) -> Reject | None:
        """What a full queue says to a request about to join it: it takes no more, but from
        a tenant under its fair share, up to its share of the queue; and a request takes the
        place of the newest waiting of the lowest class below its own (shed)."""
        model, waiting = route.model, self.waiting.get(route.model, 0)
        if waiting < route.max_queue:
            return None
        if self.classes.shed_for(model, served) is not None:
            self.notify(model)  # the one shed hears it at once
            return None
        mine = self.fair.waiting.get(model, {}).get(tenant, 0)
        if standing < 0 and mine < self.fair.queue_share(model, tenant, route.max_queue):
            return None
        retry = retry_s(route.slo_ttft_s)
        if standing > 0:
            return Reject(
                Refusal.TENANT_SHARE,
                f"{model}'s queue is full and tenant {tenant} holds more than its fair share "
                "of it", retry, Reason.QUEUE_FULL,
            )  # fmt: skip
        return Reject(Refusal.QUEUE_FULL, f"{model} has {route.max_queue} requests waiting "
                      "already", retry, Reason.QUEUE_FULL)  # fmt: skip


def _shed(model: str, service_class: str, slo: float | None) -> Reject:
    return Reject(
        Refusal.CLASS_SHED,
        f"{model}'s queue is full, and a request of a higher class took this {service_class} "
        "request's place",
        retry_s(slo),
        Reason.QUEUE_FULL,
    )
