"""Answers that come whole (not streamed, as a Batch API's lines and most batch clients ask):
no byte of one comes before its end, yet its engine runs it long before. The router must
not take one that runs for a request queued at its engine, nor its end for a first byte."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from agents.config import RouteConfig
from agents.router import predict
from agents.router.admission import Admission
from agents.router.plan import Ask, Call, Local, Peer, Placement, Progress, Reject
from agents.router.router import Router
from agents.workers.table import EngineLoad
from tests.kits.router import MODEL, SYSTEM, router_of

SLO_S = 2.0


def _whole_running(load: EngineLoad) -> tuple[Router, RouteConfig, list[float]]:
    """A worker sent a whole answer at 0 that its engine has run since; at 1 s a poll says
    `load`; it is 3 s now."""
    clock = [0.0]
    router, config, table = router_of("cost", workers=1, clock=clock)
    route = dataclasses.replace(config.routes[MODEL], slo_ttft_s=SLO_S)
    whole = router.request(MODEL, SYSTEM + b"a", max_new=256, whole=True)
    router.dispatched(router.route(route, whole, set()).ranked[0], whole)
    clock[0] = 1.0
    table.polled("w0", dataclasses.replace(load, at=1.0), 2)
    clock[0] = 3.0
    return router, route, clock


async def _next(router: Router, route: RouteConfig, clock: list[float]) -> Call | Peer | Reject:
    request = router.request(MODEL, SYSTEM + b"b", max_new=16)
    admission = Admission(router, clock=lambda: clock[0])
    placement = Placement(MODEL, route, request, None)
    async with asyncio.timeout(5):  # held (its clock stands still): it would wait for ever
        return await admission.admit(Ask("r", "t"), placement, Progress(clock[0]), None)


async def test_a_whole_answer_its_engine_runs_does_not_hold_the_next_request() -> None:
    """A poll after it was sent found nothing waiting at the engine: it runs. A request three
    seconds later is admitted at once, predicted a short wait, not the three seconds that
    answer has gone without a byte (which a queued request's age would say)."""
    load = EngineLoad(running=1, waiting=0, used_tokens=3_000, max_total_tokens=100_000)
    router, route, clock = _whole_running(load)
    plan = await _next(router, route, clock)
    assert isinstance(plan, Local), plan
    assert plan.wait_s is not None
    assert plan.wait_s < 0.5


async def test_a_whole_answer_its_engine_holds_back_is_waited_for() -> None:
    """The same, but the poll found a request waiting at the engine: it may be that one, so
    the next request is predicted to wait at least as long as it has."""
    load = EngineLoad(running=0, waiting=1, used_tokens=0, max_total_tokens=100_000)
    router, route, clock = _whole_running(load)
    request = router.request(MODEL, SYSTEM + b"b", max_new=16)
    decision = router.route(route, request, set())
    assert predict.head_age(decision.ranked[0].view, clock[0]) == pytest.approx(3.0)


def test_the_end_of_a_whole_answer_teaches_no_first_byte_speed() -> None:
    """A whole answer ends after 5 s: that is no time to a first byte. The worker's bias (how
    much later than predicted first bytes come) and its prefill rate stay as they were, and
    its decode step is not taken from it."""
    clock = [0.0]
    router, config, _ = router_of("cost", workers=1, clock=clock)
    route = config.routes[MODEL]
    view = router.views["w0"]
    before = (view.bias, view.prefill_tokens_per_s, view.decode_step_s)
    whole = router.request(MODEL, SYSTEM + b"a", max_new=256, whole=True)
    ticket = router.dispatched(router.route(route, whole, set()).ranked[0], whole, wait_s=0.2)
    clock[0] = 5.0
    router.finished(ticket, len(SYSTEM), 700, 256)
    assert (view.bias, view.prefill_tokens_per_s, view.decode_step_s) == before
    assert (view.inflight, view.unstarted, view.queued_tokens) == (0, 0, 0)
