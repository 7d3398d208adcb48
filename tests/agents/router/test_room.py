"""When an engine's KV pool has room for one more request: running answers grow a token a
step and free all they hold as they end, so when room comes depends on when they end."""

from __future__ import annotations

import pytest

from agents.router.view import WorkerView
from agents.workers.table import EngineLoad

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
    assert view.room_wait(128, load, 0.0, ANSWER, 1.0) == pytest.approx(5 * STEP_S)


def test_a_batch_that_started_together_makes_room_only_when_it_ends() -> None:
    """The same twenty answers started together: nothing ends, and nothing is freed, for the
    100 steps they all take; room comes then."""
    view, load = _view([ANSWER] * 20)
    assert view.room_wait(128, load, 0.0, ANSWER, 1.0) == pytest.approx(ANSWER * STEP_S)


def test_a_pool_with_room_for_every_answer_makes_none_wait() -> None:
    view, load = _view([ANSWER] * 10)
    assert view.room_wait(128, load, 0.0, ANSWER, 1.0) == 0.0
