"""Service classes in admission (agents/router/classes.py): slack, bounds, reserves, shedding
and fair queueing between classes, on a router with no engine and a clock of its own."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from meridian_pb.fleet.v1.classes import (
    ClassPolicy,
    ClassRule,
    ServiceClass,
    clamp,
    policy_for,
)
from pydantic import ValidationError

from agents.config import FallbackChain, RouteConfig
from agents.router.admission import Admission
from agents.router.classes import FRONT, ClassQueues, Victim, Waiter, victim_for
from agents.router.decision import Ticket
from agents.router.plan import Ask, Local, Placement, Plan, Progress, Refusal, Reject
from agents.router.policies import RouteRequest
from agents.workers.table import EngineLoad
from tests.kits.router import MODEL, SYSTEM, router_of, ticking_admission

INTERACTIVE, STANDARD, FLEX, BATCH = ServiceClass


async def _plan(
    admission: Admission,
    route: RouteConfig,
    request: RouteRequest,
    since: float,
    service_class: ServiceClass,
) -> Plan:
    ask = Ask("r", "t", service_class=service_class)
    return await admission.admit(ask, Placement(MODEL, route, request, None), Progress(since), None)


def test_a_request_can_only_lower_its_class() -> None:
    assert clamp(None, STANDARD, STANDARD) is STANDARD  # it names none: its default
    assert clamp(INTERACTIVE, STANDARD, STANDARD) is STANDARD  # above the ceiling: clamped
    assert clamp(BATCH, STANDARD, STANDARD) is BATCH  # lower: as asked
    assert clamp(INTERACTIVE, STANDARD, INTERACTIVE) is INTERACTIVE


def test_a_policy_given_in_part_keeps_each_class_default() -> None:
    policy = policy_for({"batch": {"max_wait_s": 30}, "preempt": True})
    assert policy.batch == ClassRule(weight=1, max_wait_s=30, slack=0.25, requeue=True)
    assert policy.interactive.reserve == 0.2
    assert policy.preempt
    with pytest.raises(ValidationError):
        policy_for({"interactive": {"reserve": 0.5}, "standard": {"reserve": 0.5}})
    with pytest.raises(ValidationError):
        policy_for({"gold": {"weight": 1}})


def test_classes_that_wait_are_served_in_proportion_to_their_weights() -> None:
    """Two classes backlogged on a model, weights 3 and 1: of 40 places freed, in the order
    their tags say, the heavier class gets 30 and the other 10; neither waits for ever."""
    policy = ClassPolicy(standard=ClassRule(weight=3), batch=ClassRule(weight=1))
    queues = ClassQueues()
    waiting: list[Waiter] = []
    for service_class in (STANDARD, BATCH):
        for _ in range(40):
            waiter = Waiter(service_class, queues.tag(MODEL, service_class, policy), ready=True)
            queues.wait(MODEL, waiter)
            waiting.append(waiter)
    served = []
    for _ in range(40):
        first = next(w for w in waiting if not queues.behind(MODEL, w.service_class, w.tag))
        queues.served(MODEL, first.service_class, first.tag)
        queues.left(MODEL, first)
        waiting.remove(first)
        served.append(first.service_class)
    assert served.count(STANDARD) == 30
    assert served.count(BATCH) == 10
    assert BATCH in served[:5]  # the lighter class is not made to wait for the heavier's all


def test_a_waiting_request_that_does_not_fit_holds_nobody_back() -> None:
    queues, policy = ClassQueues(), ClassPolicy()
    batch = Waiter(BATCH, queues.tag(MODEL, BATCH, policy), ready=False)
    queues.wait(MODEL, batch)
    tag = queues.tag(MODEL, INTERACTIVE, policy) + 10  # later than the batch request's
    assert not queues.behind(MODEL, INTERACTIVE, tag)
    batch.ready = True
    assert queues.behind(MODEL, INTERACTIVE, tag)
    queues.left(MODEL, batch)
    assert queues.models[MODEL].vtime == 0
    assert queues.models[MODEL].last == [0.0] * 4


def test_reserves_are_kept_while_their_class_is_active_and_always_from_a_peer() -> None:
    queues, policy = ClassQueues(), ClassPolicy()
    assert queues.kept(MODEL, STANDARD, policy, now=0.0, escalated=False) == 0.0
    assert queues.kept(MODEL, STANDARD, policy, now=0.0, escalated=True) == 0.2
    assert queues.kept(MODEL, INTERACTIVE, policy, now=0.0, escalated=True) == 0.2
    queues.arrived(MODEL, INTERACTIVE, now=100.0)
    assert queues.kept(MODEL, BATCH, policy, now=110.0, escalated=False) == 0.2
    assert queues.kept(MODEL, INTERACTIVE, policy, now=110.0, escalated=False) == 0.0
    assert queues.kept(MODEL, BATCH, policy, now=200.0, escalated=False) == 0.0  # idle since


async def test_a_batch_request_runs_only_on_capacity_others_leave_and_waits_within_its_bound() -> (
    None
):
    """The only worker has held a request back for 0.8 s. An interactive request (its SLO
    2 s) is admitted: it would start within its SLO. A batch request is admitted only where
    its first byte would come within a quarter of the SLO: it waits, and is refused 429 when
    its own bound (3 s) passes. Once the engine starts what it held, batch goes."""
    clock = [0.0]
    router, config, table = router_of("cost", workers=1, clock=clock)
    classes = policy_for({"batch": {"max_wait_s": 3}})
    route = dataclasses.replace(config.routes[MODEL], slo_ttft_s=2.0, classes=classes)
    admission = ticking_admission(router, clock)
    first = router.request(MODEL, SYSTEM + b"held")
    plan = await _plan(admission, route, first, clock[0], STANDARD)
    assert isinstance(plan, Local)
    stuck = router.dispatched(plan.decision.ranked[0], first, wait_s=plan.wait_s)
    table.polled("w0", EngineLoad(running=1, max_total_tokens=100_000), 2)
    clock[0] = 0.8
    batch = await _plan(admission, route, router.request(MODEL, SYSTEM + b"b"), clock[0], BATCH)
    assert isinstance(batch, Reject)
    assert batch.code is Refusal.OVERLOADED
    assert "batch" in batch.message
    assert batch.retry_after_s is not None
    assert batch.retry_after_s >= 3
    assert clock[0] >= 3.8  # it waited its bound, not the SLO
    clock[0] = 0.8
    interactive = router.request(MODEL, SYSTEM + b"i")
    assert isinstance(await _plan(admission, route, interactive, clock[0], INTERACTIVE), Local)
    router.first_byte(stuck)
    since, progress = clock[0], Progress(clock[0])
    placement = Placement(MODEL, route, router.request(MODEL, SYSTEM + b"c"), None)
    later = await admission.admit(Ask("r", "t", service_class=BATCH), placement, progress, None)
    assert isinstance(later, Local)
    # its wait is the one its bound judged, taken when admission let it go: not a later
    # reading of the clock, which on a busy loop could fall a little past the bound
    assert progress.admitted_at is not None
    assert since < progress.admitted_at <= clock[0]


async def test_a_full_queue_sheds_the_lowest_class_first() -> None:
    """The only worker holds a request back, so everything waits; the queue takes one. A
    batch request waits in it; an interactive request that must wait takes its place: the
    batch request is refused 429 class_shed, and the interactive one goes when the engine
    starts what it held."""
    clock = [0.0]
    router, config, table = router_of("cost", workers=1, clock=clock)
    route = dataclasses.replace(config.routes[MODEL], slo_ttft_s=10.0, max_queue=1)
    admission = Admission(router, clock=lambda: clock[0])
    first = router.request(MODEL, SYSTEM + b"held")
    plan = await _plan(admission, route, first, clock[0], STANDARD)
    assert isinstance(plan, Local)
    stuck = router.dispatched(plan.decision.ranked[0], first, wait_s=plan.wait_s)
    table.polled("w0", EngineLoad(running=1, max_total_tokens=100_000), 2)
    clock[0] = 12.0  # held 12 s: nothing fits a 10 s SLO there now
    batch = asyncio.create_task(
        _plan(admission, route, router.request(MODEL, SYSTEM + b"b"), 0.0, BATCH)
    )
    await asyncio.sleep(0)  # it looks, and waits
    assert admission.waiting[MODEL] == 1
    interactive = asyncio.create_task(
        _plan(admission, route, router.request(MODEL, SYSTEM + b"i"), clock[0], INTERACTIVE)
    )
    shed = await asyncio.wait_for(batch, 5)
    assert isinstance(shed, Reject)
    assert shed.code is Refusal.CLASS_SHED
    assert not interactive.done()
    router.first_byte(stuck)
    assert isinstance(await asyncio.wait_for(interactive, 5), Local)


async def test_an_interactive_reserve_keeps_room_that_standard_may_not_take() -> None:
    """The only worker's KV pool is 85% used and its answers end slowly. Once interactive
    traffic has come, a standard request may not take the last fifth of the pool, and waits
    (refused when its SLO passes); an interactive request is admitted there."""
    clock = [0.0]
    router, config, table = router_of("cost", workers=1, clock=clock)
    route = dataclasses.replace(config.routes[MODEL], slo_ttft_s=2.0)
    view = router.views["w0"]
    view.mean_output, view.decode_step_s = 256, 0.1
    admission = ticking_admission(router, clock)
    full = EngineLoad(running=8, used_tokens=85_000, max_total_tokens=100_000)
    table.polled("w0", full, 2)
    standard = await _plan(admission, route, router.request(MODEL, SYSTEM + b"s"), clock[0],
                           STANDARD)  # fmt: skip
    assert isinstance(standard, Local)  # no interactive traffic yet: no reserve kept
    interactive = router.request(MODEL, SYSTEM + b"i")
    assert isinstance(await _plan(admission, route, interactive, clock[0], INTERACTIVE), Local)
    table.polled("w0", full, 2)
    later = await _plan(admission, route, router.request(MODEL, SYSTEM + b"t"), clock[0],
                        STANDARD)  # fmt: skip
    assert isinstance(later, Reject)
    assert later.code is Refusal.OVERLOADED


def test_the_newest_request_of_the_lowest_class_not_yet_started_is_preempted() -> None:
    def victim(
        service_class: ServiceClass, sent_at: float, first_at: float | None = None
    ) -> Victim:
        ticket = Ticket("w0", MODEL, sent_at, 10, 10, 0, first_at=first_at)
        return Victim(ticket, service_class, abort=lambda: None)

    old_batch, new_batch, flex = victim(BATCH, 1.0), victim(BATCH, 2.0), victim(FLEX, 3.0)
    started = victim(BATCH, 4.0, first_at=4.5)
    running = [old_batch, new_batch, flex, started]
    assert victim_for(running, INTERACTIVE, "w0", True) is new_batch
    new_batch.preempted = True  # once: never twice
    assert victim_for(running, INTERACTIVE, "w0", True) is old_batch
    assert victim_for(running, FLEX, "w0", True) is old_batch  # only a lower class
    assert victim_for([flex, started], FLEX, "w0", True) is None
    assert victim_for([flex], BATCH, "w0", True) is None
    assert victim_for(running, INTERACTIVE, "w0", False) is None  # preemption is off


def test_a_request_that_requeues_gives_way_running_until_its_client_sees_a_byte() -> None:
    """Of those that requeue: on the worker the request would go to first, then the lowest
    class, the newest; a stream its client has seen a byte of never."""

    def victim(service_class: ServiceClass, sent_at: float, worker: str = "w0") -> Victim:
        ticket = Ticket(worker, MODEL, sent_at, 10, 10, 0, first_at=sent_at + 0.1)
        return Victim(ticket, service_class, abort=lambda: None, requeue=True)

    batch, flex, elsewhere = victim(BATCH, 1.0), victim(FLEX, 3.0), victim(BATCH, 4.0, "w1")
    running = [batch, flex, elsewhere]
    assert victim_for(running, INTERACTIVE, "w0", False) is batch  # running, on w0
    assert victim_for(running, INTERACTIVE, "w1", False) is elsewhere
    assert victim_for(running, STANDARD, "w2", False) is elsewhere  # the newest batch
    batch.shown = elsewhere.shown = True  # their streams have begun
    assert victim_for(running, INTERACTIVE, "w0", False) is flex
    assert victim_for(running, FLEX, "w0", False) is None
    policy = policy_for(None)
    assert policy.requeues(BATCH)
    assert policy.requeues(FLEX)
    assert not policy.requeues(STANDARD)
    assert policy.takes_room(INTERACTIVE)
    assert policy.takes_room(FLEX)
    assert not policy.takes_room(BATCH)
    none = policy_for({"flex": {"requeue": False}, "batch": {"requeue": False}})
    assert not none.takes_room(INTERACTIVE)
    assert policy_for({"standard": {"requeue": True}}).requeues(STANDARD) is False  # no bound


async def test_a_bounded_class_waits_in_its_tenants_line_and_only_its_front_looks() -> None:
    """Ten batch requests of one tenant wait: the first FRONT look for a worker, the rest
    wait for their turn, which comes as those ahead leave; another tenant's line has its own
    front; a request shed from the back hears it at once."""
    queues = ClassQueues()
    policy = policy_for(None)
    line = [Waiter(BATCH, queues.tag(MODEL, BATCH, policy), line=(BATCH, "acme"))
            for _ in range(10)]  # fmt: skip
    for waiter in line:
        queues.wait(MODEL, waiter)
    other = Waiter(BATCH, queues.tag(MODEL, BATCH, policy), line=(BATCH, "beta"))
    queues.wait(MODEL, other)
    assert [queues.in_front(MODEL, w) for w in line] == [True] * FRONT + [False] * (10 - FRONT)
    assert queues.in_front(MODEL, other)
    assert queues.in_front(MODEL, Waiter(STANDARD, 0.0))  # no line: it always looks
    nxt = line[FRONT]
    nxt.turn = asyncio.Event()
    queues.left(MODEL, line[0])
    assert nxt.turn.is_set()
    assert queues.in_front(MODEL, nxt)
    last = line[-1]
    last.turn = asyncio.Event()
    assert queues.shed_for(MODEL, INTERACTIVE) is other  # the newest batch request
    assert queues.shed_for(MODEL, INTERACTIVE) is last
    assert last.turn.is_set()


def test_a_request_behind_the_front_of_its_line_holds_no_other_class_back() -> None:
    """Ten batch requests of a tenant wait, each of which fitted as it joined. An
    interactive request tagged after them all goes after the front of the line while that
    fits; once the front has looked again and not fitted, the rest, which have not looked
    since they joined, hold it back no more (they could, seconds on, until their bounds)."""
    queues = ClassQueues()
    policy = policy_for(None)
    line = [Waiter(BATCH, queues.tag(MODEL, BATCH, policy), ready=True, line=(BATCH, "acme"))
            for _ in range(10)]  # fmt: skip
    for waiter in line:
        queues.wait(MODEL, waiter)
    tag = line[-1].tag + 1.0  # tagged after every one of them
    assert queues.behind(MODEL, INTERACTIVE, tag)
    for front in line[:FRONT]:
        front.ready = False  # they looked, and did not fit
    assert not queues.behind(MODEL, INTERACTIVE, tag)
    line[-1].ready, line[FRONT].ready = False, True
    queues.left(MODEL, line[0])  # the next gets its turn: its own look is what counts
    assert queues.behind(MODEL, INTERACTIVE, tag)


async def test_room_a_higher_class_held_lately_is_kept_from_batch_until_its_peak_fades() -> None:
    """Interactive requests held some 60% of the only worker's KV pool, and have just ended;
    no reserve is configured. Batch may not take that room while interactive is likely to
    want it back (the engine could not take it back from a batch answer): a batch request
    waits and is refused at its bound. Once interactive's peak has faded (minutes without
    such traffic) a batch request is admitted on the same pool."""
    clock = [0.0]
    router, config, table = router_of("cost", workers=1, clock=clock)
    classes = policy_for({"interactive": {"reserve": 0}, "batch": {"max_wait_s": 5}})
    route = dataclasses.replace(config.routes[MODEL], slo_ttft_s=2.0, classes=classes)
    busy = EngineLoad(running=4, used_tokens=30_000, max_total_tokens=100_000)
    table.polled("w0", busy, 2)
    tickets = []
    for n in range(3):
        request = router.request(MODEL, SYSTEM + bytes([n]), max_new=20_000,
                                 service_class=INTERACTIVE)  # fmt: skip
        tickets.append(router.dispatched(router.route(route, request, set()).ranked[0], request))
    for ticket in tickets:
        router.abandoned(ticket)
    table.polled("w0", busy, 2)
    admission = ticking_admission(router, clock)

    def batch() -> RouteRequest:
        return router.request(MODEL, SYSTEM + b"b", max_new=100, service_class=BATCH)

    held = await _plan(admission, route, batch(), clock[0], BATCH)
    assert isinstance(held, Reject)
    assert held.code is Refusal.OVERLOADED
    clock[0] += 300.0
    table.polled("w0", busy, 2)
    assert isinstance(await _plan(admission, route, batch(), clock[0], BATCH), Local)


def test_a_bounded_request_is_refused_on_arrival_where_its_line_could_not_take_it() -> None:
    """A tenant's batch line of FRONT that has had nothing admitted lately refuses the next
    batch request at once (429 overloaded, Retry-After its bound), before it is placed; a
    shorter line, another tenant's line, a class with no bound, a request the
    rule sends to a peer on overload, and a line that is being admitted fast enough to reach
    its newcomer within the bound all let it in."""
    clock = [0.0]
    router, config, _ = router_of("cost", clock=clock)
    admission = Admission(router, clock=lambda: clock[0])
    route = dataclasses.replace(
        config.routes[MODEL], slo_ttft_s=2.0, classes=policy_for({"batch": {"max_wait_s": 5}})
    )
    queues, policy = admission.classes, route.classes
    batch, other = Ask("r", "acme", service_class=BATCH), Ask("r", "beta", service_class=BATCH)
    for _ in range(FRONT - 1):
        queues.wait(MODEL, Waiter(BATCH, queues.tag(MODEL, BATCH, policy), line=(BATCH, "acme")))
    assert admission.on_arrival(batch, route, None) is None  # a line not yet FRONT long
    queues.wait(MODEL, Waiter(BATCH, queues.tag(MODEL, BATCH, policy), line=(BATCH, "acme")))
    refused = admission.on_arrival(batch, route, None)
    assert isinstance(refused, Reject)
    assert refused.code is Refusal.OVERLOADED
    assert refused.retry_after_s == 5
    assert f"{FRONT} batch requests of tenant acme" in refused.message
    assert admission.on_arrival(other, route, None) is None  # its own line is empty
    assert admission.on_arrival(Ask("r", "acme", service_class=STANDARD), route, None) is None
    overflow = FallbackChain("spill", None, None, frozenset({"overload"}), (), classes=frozenset(
        {BATCH}))  # fmt: skip
    assert admission.on_arrival(batch, route, overflow) is None  # a peer may take it
    for _ in range(20):  # the line had 4 a second admitted lately: more than FRONT in 5 s
        clock[0] += 0.25
        queues.admitted(MODEL, (BATCH, "acme"), clock[0])
    assert admission.on_arrival(batch, route, None) is None
    clock[0] += 30.0  # and then nothing for a while: the rate fades
    assert isinstance(admission.on_arrival(batch, route, None), Reject)
