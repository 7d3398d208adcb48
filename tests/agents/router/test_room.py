"""When an engine's KV pool has room for one more request: running answers grow a token a
step and free all they hold as they end, so when room comes depends on when they end."""

from __future__ import annotations

import dataclasses

import pytest

from agents.router import predict
from agents.router.admission import Admission
from agents.router.plan import Ask, Local, Placement, Progress
from agents.router.view import WorkerView
from agents.workers.table import EngineLoad
from tests.kits.router import (
    MODEL,
    SYSTEM,
    admitted,
    overloaded,
    router_of,
    ticking_admission,
)

STEP_S = 0.01
ANSWER = 100  # tokens each answer takes
PROMPT = 400  # uncached prompt tokens each holds


def _view(rests: list[int]) -> tuple[WorkerView, EngineLoad]:
    """A worker running one request of ours per entry, each with that many tokens to come."""
    view = WorkerView("w", prefill_tokens_per_s=20_000, decode_step_s=STEP_S)
    for key, rest in enumerate(rests):
        view.flew(key, -100.0, ANSWER, PROMPT)
        view.started(key, -(ANSWER - rest) * STEP_S)
    used = sum(PROMPT + ANSWER - rest for rest in rests)
    return view, EngineLoad(running=len(rests), used_tokens=used, max_total_tokens=10_000)


def test_a_staggered_batch_makes_room_as_its_first_answer_ends() -> None:
    """Twenty answers ending 5 steps apart: the pool lacks room for every answer to finish
    now, and has it once the first ends and frees its 500 tokens, 5 steps from now."""
    view, load = _view([5 * i for i in range(1, 21)])
    assert predict.room_wait(view, 128, load, 0.0, ANSWER, 1.0) == pytest.approx(5 * STEP_S)


def test_a_batch_that_started_together_makes_room_only_when_it_ends() -> None:
    """The same twenty answers started together: nothing ends, and nothing is freed, for the
    100 steps they all take; room comes then."""
    view, load = _view([ANSWER] * 20)
    assert predict.room_wait(view, 128, load, 0.0, ANSWER, 1.0) == pytest.approx(ANSWER * STEP_S)


def test_answers_running_past_their_expected_end_have_not_freed_their_room() -> None:
    """Twenty answers that started together 150 steps ago and were expected to take 100: the
    engine runs slower than learned, and they still run, holding a full pool. Room is not
    there now (by the learned step they would have ended and freed it, and the requests
    waiting for that room would be let through to wait at the engine), but soon: they are
    taken to have a tenth of their answers to come, at the step they show."""
    view = WorkerView("w", prefill_tokens_per_s=20_000, decode_step_s=STEP_S)
    for key in range(20):
        view.flew(key, -2.0, ANSWER, PROMPT)
        view.started(key, -150 * STEP_S)
    load = EngineLoad(running=20, used_tokens=20 * (PROMPT + 95), max_total_tokens=10_000)
    wait = predict.room_wait(view, 128, load, 0.0, ANSWER, 1.0)
    assert 0.1 * ANSWER * STEP_S < wait < ANSWER * STEP_S


def test_what_a_streamed_answer_has_run_is_counted_from_its_events_not_its_age() -> None:
    """Twenty answers started together 50 steps ago by the learned step, whose streams have
    each relayed 2 events of 5 tokens (the engine runs slower than learned): 90 tokens of
    each are to come, not 50. An answer not streamed runs by time."""
    view = WorkerView("w", prefill_tokens_per_s=20_000, decode_step_s=STEP_S)
    view.learn_events(ANSWER, ANSWER // 5)  # 5 tokens an event, as answers here have shown
    load = EngineLoad(running=21, used_tokens=0, max_total_tokens=100_000)
    for key in range(21):
        view.flew(key, -1.0, ANSWER, PROMPT)
        view.started(key, -50 * STEP_S)
    for key in range(20):
        view.progressed(key, 2)
    assert predict.to_come(view, load, 0.0) == pytest.approx(20 * 90 + 50)
    view.landed(0)
    assert predict.to_come(view, dataclasses.replace(load, running=20), 0.0) == pytest.approx(
        19 * 90 + 50
    )


def test_a_pool_with_room_for_every_answer_makes_none_wait() -> None:
    view, load = _view([ANSWER] * 10)
    assert predict.room_wait(view, 128, load, 0.0, ANSWER, 1.0) == 0.0


async def test_an_engine_holding_requests_back_keeps_the_third_here_whatever_the_model_says() -> (
    None
):
    """The engine holds a request back, though by the model its pool has room. Two requests
    sent there have not started (`max_unstarted`, 2): a third waits here, and is answered
    429 when its SLO passes, rather than joining the engine's queue; and the model is marked
    full."""
    clock = [0.0]
    router, config, table = router_of("cost", workers=1, clock=clock)
    route = dataclasses.replace(config.routes[MODEL], slo_ttft_s=2.0)
    view = router.views["w0"]
    for n in range(5):
        view.flew(1000 + n, -1.0, ANSWER, PROMPT)
        view.started(1000 + n, -0.5)  # half their answers to come
    holding = EngineLoad(running=5, waiting=1, used_tokens=10_000, max_total_tokens=100_000)
    table.polled("w0", holding, 2)
    assert predict.room_wait(view, 128, holding, 0.0) == 0.0  # the model sees room
    admission = ticking_admission(router, clock)
    for key in (b"a", b"b"):
        request = router.request(MODEL, SYSTEM + key)
        plan = await admitted(admission, route, request, clock[0])
        router.dispatched(plan.decision.ranked[0], request, wait_s=plan.wait_s)
        assert not request.full  # nothing of the model has waited here yet
    assert await overloaded(admission, route, router.request(MODEL, SYSTEM + b"c"), clock[0])
    # the model is full: for a while its requests are routed by their first token (a copy
    # of a prefix would take prefill that others wait for)
    later = router.request(MODEL, SYSTEM + b"d")
    assert await overloaded(admission, route, later, clock[0])
    assert later.full


async def test_first_bytes_later_than_admission_predicted_raise_the_bias() -> None:
    """A request admitted behind one that has waited a second at the engine is predicted to
    wait that second (not the policy's prefill estimate); its first byte comes after three,
    and the worker's bias rises, so that admission expects more next time."""
    clock = [0.0]
    router, config, table = router_of("cost", workers=1, clock=clock)
    route = dataclasses.replace(config.routes[MODEL], slo_ttft_s=2.0)
    table.polled("w0", EngineLoad(running=5, used_tokens=10_000, max_total_tokens=100_000), 2)
    first = router.request(MODEL, SYSTEM + b"a")
    router.dispatched(router.route(route, first, set()).ranked[0], first)
    clock[0] = 1.0
    request = router.request(MODEL, SYSTEM + b"b")
    plan = await Admission(router, clock=lambda: clock[0]).admit(
        Ask("r", "t"), Placement(MODEL, route, request, None), Progress(clock[0]), None
    )
    assert isinstance(plan, Local)
    assert plan.decision.ranked[0].ttft_s < 0.5  # the policy's estimate: a short prefill
    ticket = router.dispatched(plan.decision.ranked[0], request, wait_s=plan.wait_s)
    assert ticket.predicted_s == pytest.approx(1.0)  # what the oldest unstarted has waited
    clock[0] = 4.0
    router.first_byte(ticket)
    assert router.views["w0"].bias == pytest.approx(1.2)
