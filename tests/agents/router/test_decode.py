"""The answer's own decode in the cost policy's price: a worker's step grows with its batch
(its step line, fitted to the engine's gauges), so a hot prefix is copied to an idle worker
once sharing its holder's batch costs every answer there more than a prefill."""

from __future__ import annotations

from agents.router.steps import StepLine
from agents.workers.table import EngineLoad
from tests.kits.router import MODEL, SYSTEM, router_of


def test_the_step_line_is_fitted_from_polls_and_unknown_while_the_batch_holds_still() -> None:
    line = StepLine()
    for _ in range(20):
        line.observe(8, 0.010)
    assert line.slope() is None  # one batch size: no slope to see
    for running in (2, 4, 8, 16, 32, 16, 8, 4, 2) * 5:
        line.observe(running, 0.006 + 0.0003 * running)
    slope = line.slope()
    assert slope is not None
    assert abs(slope - 0.0003) < 0.0001


def test_a_hot_prefix_is_copied_to_an_idle_worker_once_its_batch_slows_every_answer() -> None:
    """sglang issue #21199's shape: one prefix, two workers. w0 holds it and its engine's
    step has grown with its batch (6 ms and 0.3 ms a request, as its gauges showed while the
    batch grew); w1 is idle. While w0 runs few, the prefix stays (recomputing it elsewhere
    costs more than sharing w0's steps); once w0's batch makes every answer there slower by
    more than a prefill of the prefix, w1 takes a copy; unless an engine queues requests or
    the region is full, when a copy would take prefill that others wait for."""
    router, config, table = router_of("cost", params={"price_answers": True})
    route = config.routes[MODEL]
    first = router.request(MODEL, SYSTEM + b"first")
    chosen = next(c for c in router.route(route, first, set()).ranked if c.worker.id == "w0")
    router.finished(router.dispatched(chosen, first), 0, None, 256)
    view = router.views["w0"]
    view.prefill_tokens_per_s = 10_000
    view.decode_step_s, view.decode_batch = 0.0066, 2.0  # its answers' gaps, at a batch of 2
    router.views["w1"].prefill_tokens_per_s = 10_000
    router.views["w1"].decode_step_s = 0.006
    for running in (2, 4, 8, 16, 32, 8, 2):
        view.line.observe(running, 0.006 + 0.0003 * running)

    def goes(running: int, waiting: int = 0, full: bool = False) -> str:
        table.polled("w0", EngineLoad(running=running, waiting=waiting, used_tokens=20_000,
                                      step_s=0.006 + 0.0003 * running,
                                      max_total_tokens=100_000), 2)  # fmt: skip
        request = router.request(MODEL, SYSTEM + f"q{running}".encode())
        request.full = full
        return router.route(route, request, set()).ranked[0].worker.id

    assert goes(2) == "w0"
    assert goes(40) == "w1"
    # once an engine queues, or requests have lately waited in admission for room, prefill
    # is what binds: answers are not priced, the prefix stays
    assert goes(40, waiting=3) == "w0"
    assert goes(40, full=True) == "w0"


def test_without_answer_prices_a_hot_prefix_stays_where_it_is_cached() -> None:
    """The default prices the first token: w0's batch of 40 does not delay it much, so the
    prefix stays (cache affinity keeps capacity; the answers there run slower)."""
    router, config, table = router_of("cost")
    route = config.routes[MODEL]
    first = router.request(MODEL, SYSTEM + b"first")
    chosen = next(c for c in router.route(route, first, set()).ranked if c.worker.id == "w0")
    router.finished(router.dispatched(chosen, first), 0, None, 256)
    table.polled("w0", EngineLoad(running=40, used_tokens=20_000, step_s=0.018,
                                  max_total_tokens=100_000), 2)  # fmt: skip
    request = router.request(MODEL, SYSTEM + b"q40")
    assert router.route(route, request, set()).ranked[0].worker.id == "w0"
