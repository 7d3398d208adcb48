"""The simulated scheduler keeps SGLang's limits: capped and chunked prefill, no cache hits on
prefixes computed in the same step, a KV pool that holds generated tokens too, retraction
when it runs short, and a speed per engine. Time is virtual here: each step advances a clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from agents.engines.sim.cost import CostModel
from agents.engines.sim.engine import Engine
from agents.engines.sim.radix import Listener, namespace
from agents.engines.sim.request import Priority, Request


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.steps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.steps.append(seconds)
        self.now += max(0.0, seconds)
        await asyncio.sleep(0)


class Watch(Listener):
    """Checks the pool after every step."""

    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.peak = 0

    async def flush(self) -> None:
        assert self.engine is not None
        self.peak = max(self.peak, self.engine.held_tokens)


async def _engine(**options: object) -> tuple[Engine, Clock, Watch]:
    clock, watch = Clock(), Watch()
    capacity = int(options.pop("capacity", 100_000))  # type: ignore[call-overload]
    engine = Engine(
        cost=CostModel(max_total_tokens=capacity),
        max_running=int(options.pop("max_running", 64)),  # type: ignore[call-overload]
        clock=clock,
        sleep=clock.sleep,
        listener=watch,
        **options,  # type: ignore[arg-type]
    )
    watch.engine = engine
    return engine, clock, watch


@pytest.fixture
async def running() -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks: list[asyncio.Task[None]] = []
    yield tasks
    for task in tasks:
        task.cancel()


async def _all_done(requests: list[Request]) -> None:
    await asyncio.wait_for(asyncio.gather(*(r.ended.wait() for r in requests)), 10)


async def test_a_long_prompt_is_prefilled_in_chunks_and_the_queue_over_several_steps(
    running: list[asyncio.Task[None]],
) -> None:
    engine, clock, _ = await _engine(chunked_prefill_size=8192, max_prefill_tokens=16384)
    running.append(asyncio.create_task(engine.run()))
    long = engine.new_request(list(range(1000, 21000)), 2)  # 20,000 tokens
    short = engine.new_request(list(range(50_000, 50_100)), 2)
    engine.submit(long)
    engine.submit(short)
    await _all_done([long, short])
    cost = engine.cost
    # Three chunks of at most 8192 tokens; the short prompt rides in the third step's room.
    chunks = [cost.prefill(8192), cost.prefill(8192), cost.prefill(3616 + 100)]
    assert clock.steps[:3] == pytest.approx(chunks)
    assert long.first_token_at == pytest.approx(sum(clock.steps[:3]))
    assert short.first_token_at == long.first_token_at


async def test_prefixes_computed_in_the_same_step_are_not_cache_hits(
    running: list[asyncio.Task[None]],
) -> None:
    engine, _, _ = await _engine()
    running.append(asyncio.create_task(engine.run()))
    shared = list(range(1000, 2000))
    together = [engine.new_request([*shared, i], 1) for i in range(3)]
    for request in together:
        engine.submit(request)
    await _all_done(together)
    assert [r.cached for r in together] == [0, 0, 0]
    later = engine.new_request([*shared, 99], 1)
    engine.submit(later)
    await _all_done([later])
    assert later.cached == len(shared)


async def test_generated_tokens_are_reserved_and_the_pool_never_overflows(
    running: list[asyncio.Task[None]],
) -> None:
    engine, _, watch = await _engine(capacity=6000)
    running.append(asyncio.create_task(engine.run()))
    prompts = [list(range(i * 10_000, i * 10_000 + 1000)) for i in range(8)]
    requests = [engine.new_request(prompt, 800) for prompt in prompts]
    for request in requests:
        engine.submit(request)
    await asyncio.sleep(0)
    for _ in range(20):  # let the first prefill step run
        await asyncio.sleep(0)
    # 8 x (1000 prompt + 0.7 x 800 reserved) does not fit 6000 tokens: some wait.
    assert 0 < len(engine.running) < len(requests)
    await _all_done(requests)
    assert watch.peak <= 6000
    assert all(r.finish == "length" and r.generated == 800 for r in requests)


async def test_a_pool_that_runs_short_in_decode_retracts_and_still_finishes_all(
    running: list[asyncio.Task[None]],
) -> None:
    engine, _, watch = await _engine(capacity=3000)
    running.append(asyncio.create_task(engine.run()))
    # Short prompts with long outputs: the reserve decays, the batch grows, the pool runs out.
    requests = [engine.new_request(list(range(i * 1000, i * 1000 + 100)), 1400) for i in range(6)]
    for request in requests:
        engine.submit(request)
    await _all_done(requests)
    assert engine.retracted_total > 0
    assert watch.peak <= 3000
    assert all(r.finish == "length" and r.generated == 1400 for r in requests)
    assert all(r.output[:1400] == r.output[: r.generated] for r in requests)


@pytest.mark.parametrize("by_priority", [False, True], ids=["length", "priority"])
async def test_a_pool_that_runs_short_retracts_by_length_or_by_priority_as_sglang_does(
    running: list[asyncio.Task[None]], by_priority: bool
) -> None:
    """SGLang retracts the shortest answer so far, most often the newest request, whatever
    its class; with `--retraction-policy priority` the lowest priority goes first."""
    policy = Priority(preempt=False, retract_by_priority=by_priority)
    engine, _, _ = await _engine(capacity=3000, priority=policy)
    running.append(asyncio.create_task(engine.run()))
    low = [engine.new_request(list(range(i * 1000, i * 1000 + 100)), 1400) for i in range(2)]
    high = [engine.new_request(list(range(i * 1000, i * 1000 + 100)), 1400) for i in (5, 6)]
    for request in low:
        request.priority = 0
        engine.submit(request)
    await _until(lambda: all(r.generated >= 200 for r in low))
    for request in high:
        request.priority = 30
        engine.submit(request)
    await _until(lambda: engine.retracted_total > 0)
    first = [r for r in engine.waiting if r in low + high]
    assert len(first) == 1
    assert first[0] in (low if by_priority else high)
    await _all_done(low + high)
    assert all(r.finish == "length" and r.generated == 1400 for r in low + high)


async def test_a_faster_engine_runs_the_same_steps_in_less_time(
    running: list[asyncio.Task[None]],
) -> None:
    times = []
    for speed in (1.0, 2.0):
        engine, _, _ = await _engine(speed=speed)
        task = asyncio.create_task(engine.run())
        running.append(task)
        request = engine.new_request(list(range(4000)), 10)
        engine.submit(request)
        await _all_done([request])
        assert request.finished_at is not None
        times.append(request.finished_at - request.arrived)
    assert times[1] == pytest.approx(times[0] / 2)


async def test_with_priorities_the_queue_is_taken_highest_first_and_ties_by_arrival(
    running: list[asyncio.Task[None]],
) -> None:
    engine, _, _ = await _engine(max_running=1, priority=Priority(preempt=False))
    first = engine.new_request(list(range(10)), 50)
    engine.submit(first)
    queued = []
    for n, priority in enumerate((0, 30, None, 30, 10)):
        request = engine.new_request(list(range(100 * (n + 1), 100 * (n + 1) + 10)), 2)
        request.priority = priority
        engine.submit(request)
        queued.append(request)
    running.append(asyncio.create_task(engine.run()))
    await _all_done([first, *queued])
    order = sorted(queued, key=lambda r: r.finished_at or 0)
    # 30, 30 (in arrival), 10, 0, then None (the lowest there is, no default being set)
    assert [queued.index(r) for r in order] == [1, 3, 4, 0, 2]
    assert engine.preempted_total == 0


async def test_a_request_far_enough_above_running_ones_retracts_the_lowest_and_all_finish(
    running: list[asyncio.Task[None]],
) -> None:
    engine, _, _ = await _engine(max_running=2, priority=Priority(default=20, threshold=10))
    low = [engine.new_request(list(range(10 * i, 10 * i + 10)), 400) for i in range(2)]
    low[0].priority = 0
    low[1].priority = 5
    for request in low:
        engine.submit(request)
    running.append(asyncio.create_task(engine.run()))
    await _until(lambda: all(r.generated >= 5 for r in low))
    near = engine.new_request(list(range(500, 510)), 5)
    near.priority = 15  # 15 above 0, 10 above 5: only the lowest may go
    engine.submit(near)
    await _until(lambda: near.admitted is not None)
    assert engine.preempted_total == 1
    assert low[0] in engine.waiting  # the lowest went
    assert low[1] in engine.decoding
    await asyncio.wait_for(near.ended.wait(), 10)
    assert not any(r.done for r in low)
    equal = engine.new_request(list(range(600, 610)), 5)
    equal.priority = 5  # not above anything that runs by more than 10: it waits
    engine.submit(equal)
    await _all_done([*low, equal])
    assert engine.preempted_total == 1
    assert all(r.finish == "length" and r.generated == r.max_new_tokens for r in low)
    assert (equal.finished_at or 0) > min(r.finished_at or 0 for r in low)


async def _until(done: Callable[[], bool]) -> None:
    """Until `done()`, stepping the engine's loop (time is virtual: no wall clock passes)."""
    for _ in range(100_000):
        if done():
            return
        await asyncio.sleep(0)
    raise AssertionError("never")


async def test_an_abort_takes_effect_between_steps_its_rid_the_engines_until_then(
    running: list[asyncio.Task[None]],
) -> None:
    """As SGLang's scheduler takes an abort between its steps: until then the request runs and
    its rid is still the engine's (a request naming it is refused as a duplicate)."""
    engine, _, _ = await _engine()
    long = engine.new_request(list(range(100)), 1000, rid="r-1")
    engine.submit(long)
    running.append(asyncio.create_task(engine.run()))
    async with asyncio.timeout(10):
        while long.generated < 3:  # noqa: ASYNC110 (the engine's steps: no event per token)
            await asyncio.sleep(0)
    engine.abort_soon("r-1")
    assert long in engine.running  # not yet: the step under way ends first
    assert not long.done
    await asyncio.wait_for(long.ended.wait(), 10)
    assert long.finish == "abort"
    assert long.generated < 1000
    assert not engine.running


async def test_a_batch_holds_at_most_max_loras_per_batch_adapters_and_keys_its_cache_by_them(
    running: list[asyncio.Task[None]],
) -> None:
    """Two adapters a batch (the base model one of them): a request of a third waits until
    one of theirs has ended, while a later request of an adapter already running is taken
    past it; an adapter's prefix is cached apart from the base model's."""
    engine, _, _ = await _engine(max_loras_per_batch=2)
    running.append(asyncio.create_task(engine.run()))
    prompt = list(range(1000, 1600))
    base = engine.new_request(prompt, 400, salt=namespace("s", None))
    first = engine.new_request(prompt, 400, salt=namespace("s", "a"))
    third = engine.new_request(prompt, 20, salt=namespace("s", "b"))
    again = engine.new_request([*prompt, 7], 20, salt=namespace("s", "a"))
    for request in (base, first, third, again):
        engine.submit(request)
    await _all_done([again])
    assert not third.ended.is_set()  # passed over: its adapter had no room in the batch
    await _all_done([base, first, third])
    ends = [r.finished_at for r in (base, first) if r.finished_at is not None]
    assert third.first_token_at is not None
    assert third.first_token_at >= min(ends)
    later = {name: engine.new_request([*prompt, 8], 1, salt=namespace("s", name))
             for name in ("a", "c")}  # fmt: skip
    for request in later.values():
        engine.submit(request)
    await _all_done(list(later.values()))
    assert later["a"].cached == len(prompt)  # the adapter's own prefix
    assert later["c"].cached == 0  # not the base model's nor another adapter's
