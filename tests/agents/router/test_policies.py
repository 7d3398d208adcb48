"""The router's decisions over a worker table it is handed: cache affinity without hot spots,
vetoes, SGLang's cache_aware semantics, and the breaker."""

from __future__ import annotations

import dataclasses

import pytest
from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.params import CostParams

from agents.config import compile_config
from agents.errors import SnapshotInvalid
from agents.router import predict
from agents.router.view import WorkerView
from agents.workers.table import EngineLoad
from tests.kits.router import (
    MODEL,
    SYSTEM,
    admitted,
    overloaded,
    router_of,
    send,
    ticking_admission,
)


def test_cost_follows_the_cached_prefix_while_the_worker_is_not_busier() -> None:
    router, config, _ = router_of("cost")
    first = send(router, config, SYSTEM + b"question one")
    for ticket_worker in list(router.views.values()):
        ticket_worker.inflight = ticket_worker.queued_tokens = 0  # all finished
        ticket_worker.sent_since_poll = ticket_worker.tokens_since_poll = 0
    again = send(router, config, SYSTEM + b"question two")
    assert again == first


def test_cost_does_not_hot_spot_one_worker_on_a_single_hot_prefix() -> None:
    """sglang issue #21199: every request shares one prefix; a router gated on request counts
    piles them on one worker. Queued work there makes the other cheaper, once it outweighs
    recomputing the prefix on the other (at `miss_weight` 1, twice its prefill)."""
    router, config, _ = router_of("cost")
    questions = [f"question {i}: ".encode() + b"please say more about it " * 8 for i in range(60)]
    chosen = [send(router, config, SYSTEM + q) for q in questions]
    assert set(chosen) == {"w0", "w1"}
    assert min(chosen.count("w0"), chosen.count("w1")) >= 15


def test_a_kv_pool_past_the_configured_limit_vetoes_a_worker() -> None:
    router, config, table = router_of("cost", params={"max_kv_usage": 0.95})
    table.polled("w0", EngineLoad(used_tokens=99_000, max_total_tokens=100_000), fail_after=2)
    request = router.request(MODEL, SYSTEM)
    decision = router.route(config.routes[MODEL], request, set())
    assert [c.worker.id for c in decision.ranked] == ["w1"]
    assert "kv usage" in decision.vetoed[0].veto
    # by default a full pool is no veto: the engine queues for room, and the wait is priced
    router, config, table = router_of("cost")
    table.polled("w0", EngineLoad(used_tokens=99_000, max_total_tokens=100_000), fail_after=2)
    decision = router.route(config.routes[MODEL], router.request(MODEL, SYSTEM), set())
    assert not decision.vetoed
    assert len(decision.ranked) == 2


def test_a_busy_worker_whose_decode_step_is_past_the_itl_slo_takes_no_more_work() -> None:
    """The other face of a hot spot: the cached worker's batch has grown until its tokens come
    slower than the SLO allows; more work there would break the SLO of all it runs."""
    router, config, table = router_of("cost", itl_ms=50)
    first = send(router, config, SYSTEM + b"question one")
    table.polled(first, EngineLoad(running=40, max_total_tokens=100_000), fail_after=2)
    router.views[first].decode_step_s = 0.055
    request = router.request(MODEL, SYSTEM + b"question two")
    decision = router.route(config.routes[MODEL], request, set())
    assert decision.ranked[0].worker.id != first
    assert "ITL SLO" in decision.vetoed[0].veto
    # idle again, its step is no reason to keep it out
    table.polled(first, EngineLoad(max_total_tokens=100_000), fail_after=2)
    router.views[first].inflight = 0
    again = router.route(config.routes[MODEL], router.request(MODEL, SYSTEM + b"three"), set())
    assert not again.vetoed


def test_a_worker_whose_kv_pool_holds_requests_back_is_priced_for_the_wait() -> None:
    """Its prefill queue is short, but its KV pool is full and 20 requests wait for room: they
    and this one are admitted only as running requests finish and free theirs."""
    router, config, table = router_of("cost")
    first = send(router, config, SYSTEM + b"question one")
    for view in router.views.values():
        view.inflight = view.queued_tokens = view.sent_since_poll = view.tokens_since_poll = 0
    full = EngineLoad(
        running=50, waiting=20, used_tokens=94_000, pending_tokens=20 * 600,
        max_total_tokens=100_000,
    )  # fmt: skip
    table.polled(first, full, 2)
    decision = router.route(config.routes[MODEL], router.request(MODEL, SYSTEM + b"two"), set())
    assert decision.ranked[0].worker.id != first
    held = next(c for c in decision.ranked if c.worker.id == first)
    # ~8,000 tokens short; the batch's 94,000 tokens turn over in 128 steps of 10 ms
    assert held.ttft_s > 8_000 / (94_000 / (128 * 0.01))


def test_room_is_priced_by_what_a_request_needs_of_the_pool() -> None:
    """On a full pool a recomputed prefix waits longer than a hit; with room, neither waits."""
    view = WorkerView("w", prefill_tokens_per_s=20_000, decode_step_s=0.02)
    view.mean_output = 256
    full = EngineLoad(running=40, waiting=4, used_tokens=50_000, pending_tokens=2_000,
                      max_total_tokens=52_000)  # fmt: skip
    hit, miss = predict.room_wait(view, 128, full, 0.0), predict.room_wait(view, 2_176, full, 0.0)
    assert 0 < hit < miss
    roomy = EngineLoad(running=10, used_tokens=10_000, max_total_tokens=52_000)
    assert predict.room_wait(view, 2_176, roomy, 0.0) == 0


def test_a_batch_that_started_together_holds_the_queue_until_it_ends() -> None:
    """Twenty requests started together, each to answer 256 tokens at 20 ms a step: none
    ends for 5.1 s. Half a second in, a request the engine holds back for room waits the
    4.6 s until they end, not a share of the batch's turnover (0.5 s)."""
    view = WorkerView("w", prefill_tokens_per_s=20_000, decode_step_s=0.02)
    for key in range(20):
        view.flew(key, 0.0, view.answer(256))
        view.started(key, 0.0)
    holding = EngineLoad(running=20, waiting=2, used_tokens=40_000, max_total_tokens=100_000)
    assert predict.held_wait(view, holding, 0.5) == pytest.approx(4.62)
    for key in range(10):  # the first ten started long before: they end at once
        view.landed(key)
        view.flew(100 + key, 0.0, view.answer(256))
        view.started(100 + key, -5.0)
    assert predict.held_wait(view, holding, 0.5) == 0.0


async def test_admission_scales_its_prediction_by_how_late_first_bytes_have_come() -> None:
    """First bytes at the only worker have come three times later than predicted: a request
    predicted at 0.8 s is held against a 2 s SLO and answered 429, as it would have missed;
    early first bytes lower the scale again, never below the prediction."""
    clock = [0.0]
    router, config, table = router_of("cost", workers=1, clock=clock)
    route = dataclasses.replace(config.routes[MODEL], slo_ttft_s=2.0)
    admission = ticking_admission(router, clock)
    view = router.views["w0"]
    for _ in range(50):
        view.learn_bias(0.5, 1.5)
    assert view.bias == pytest.approx(3.0, rel=0.05)
    table.polled("w0", EngineLoad(running=5, used_tokens=10_000, max_total_tokens=100_000), 2)
    request = router.request(MODEL, SYSTEM + b"a")
    view.prefill_tokens_per_s = request.prompt_tokens / 0.8
    predicted = router.route(route, request, set()).best_ttft_s
    assert predicted is not None
    assert 0.8 <= predicted < 1.0  # within the SLO at face value
    assert await overloaded(admission, route, request, clock[0])
    for _ in range(1000):
        view.learn_bias(0.5, 0.1)
    assert view.bias == 1.0


def test_a_new_prefix_goes_where_less_traffic_is_drawn() -> None:
    """Both workers idle: the prefix no worker holds goes to the one whose cached prefixes
    draw less traffic, which it will share for as long as affinity keeps it there."""
    router, config, _ = router_of("cost")
    tickets = []
    for i in range(6):
        request = router.request(MODEL, SYSTEM + f"question {i}".encode())
        decision = router.route(config.routes[MODEL], request, set())
        tickets.append(router.dispatched(decision.ranked[0], request))
    assert {t.worker_id for t in tickets} == {"w0"}  # the prefix's worker
    for ticket in tickets:
        router.finished(ticket, 0, None, 16)
    other = ("an unrelated system prompt about tides and harbours. " * 40).encode()
    assert send(router, config, other) == "w1"


def test_a_prefix_both_hold_goes_by_price_not_by_the_traffic_drawn() -> None:
    """Both workers hold the prefix and w1 has drawn the traffic lately, but w0 has a short
    queue: the cheaper w1 serves. Traffic drawn only decides where a new prefix is placed."""
    router, config, table = router_of("cost")

    def send_to(worker_id: str, key: bytes) -> None:
        request = router.request(MODEL, key)
        decision = router.route(config.routes[MODEL], request, set())
        chosen = next(c for c in decision.ranked if c.worker.id == worker_id)
        router.finished(router.dispatched(chosen, request), 0, None, 16)

    for i in range(8):
        send_to("w1" if i else "w0", SYSTEM + f"question {i}".encode())
    queued = EngineLoad(running=1, waiting=1, used_tokens=5_000, pending_tokens=1_000,
                        max_total_tokens=100_000)  # fmt: skip
    table.polled("w0", queued, 2)
    decision = router.route(config.routes[MODEL], router.request(MODEL, SYSTEM + b"next"), set())
    held = {c.worker.id: c for c in decision.ranked}
    assert held["w0"].matched_tokens == held["w1"].matched_tokens > 0
    params = config.routes[MODEL].params
    assert isinstance(params, CostParams)
    assert held["w0"].score_s - held["w1"].score_s < params.tie_s
    assert decision.ranked[0].worker.id == "w1"


def test_a_prefix_both_hold_goes_to_fewer_requests_when_prices_are_within_the_noise() -> None:
    """w0's learned decode step is a little shorter, but it lags: w0 runs five times the
    requests. Prices 2 ms apart are the model's noise; the fewer requests win."""
    router, config, table = router_of("cost")
    for worker in ("w0", "w1"):
        request = router.request(MODEL, SYSTEM + worker.encode())
        decision = router.route(config.routes[MODEL], request, set())
        chosen = next(c for c in decision.ranked if c.worker.id == worker)
        router.finished(router.dispatched(chosen, request), 0, None, 16)
    for worker, running, step in (("w0", 10, 0.010), ("w1", 2, 0.012)):
        table.polled(worker, EngineLoad(running=running, used_tokens=20_000,
                                        max_total_tokens=100_000), 2)  # fmt: skip
        router.views[worker].decode_step_s = step
    decision = router.route(config.routes[MODEL], router.request(MODEL, SYSTEM + b"next"), set())
    held = {c.worker.id: c for c in decision.ranked}
    assert held["w0"].score_s < held["w1"].score_s
    assert decision.ranked[0].worker.id == "w1"


async def test_admission_holds_a_request_while_the_engine_has_not_started_older_ones() -> None:
    """Whatever holds requests back at the only worker (KV room, a stall), the oldest one sent
    there has waited 1.5 s without a first byte: with a 2 s TTFT SLO, a request that has
    waited 1 s here would wait at least that long there, so it stays here, where it can be
    shed, and is answered 429 when its SLO passes. Once the engine starts what it holds,
    requests go again."""
    clock = [0.0]
    router, config, table = router_of("cost", workers=1, clock=clock)
    route = dataclasses.replace(config.routes[MODEL], slo_ttft_s=2.0)
    admission = ticking_admission(router, clock)
    request = router.request(MODEL, SYSTEM + b"first")
    first = await admitted(admission, route, request, 0.0)
    stuck = router.dispatched(first.decision.ranked[0], request, wait_s=first.wait_s)
    clock[0] = 1.5
    table.polled("w0", EngineLoad(running=1, max_total_tokens=100_000), 2)
    assert await overloaded(admission, route, router.request(MODEL, SYSTEM + b"b"), 0.5)
    router.first_byte(stuck)
    plan = await admitted(admission, route, router.request(MODEL, SYSTEM + b"c"), clock[0])
    assert plan.decision.ranked[0].worker.id == "w0"


async def test_admission_counts_what_the_engine_holds_back_by_requests() -> None:
    """The only worker's pool looks roomy by the arithmetic, but its engine holds 10 requests
    back (it reserves more for answers than the arithmetic knows, or retracts). Each starts
    as one of its 20 running requests finishes, in 256 steps of 20 ms: 2.6 s, past a 2 s SLO.
    The request is held here and answered 429; once the engine's queue is gone it goes."""
    clock = [0.0]
    router, config, table = router_of("cost", workers=1, clock=clock)
    route = dataclasses.replace(config.routes[MODEL], slo_ttft_s=2.0)
    view = router.views["w0"]
    view.mean_output, view.decode_step_s = 256, 0.02
    admission = ticking_admission(router, clock)
    holding = EngineLoad(running=20, waiting=10, used_tokens=40_000, max_total_tokens=100_000)
    table.polled("w0", holding, 2)
    assert await overloaded(admission, route, router.request(MODEL, SYSTEM + b"a"), clock[0])
    table.polled("w0", dataclasses.replace(holding, waiting=0), 2)
    plan = await admitted(admission, route, router.request(MODEL, SYSTEM + b"b"), clock[0])
    assert plan.decision.ranked[0].worker.id == "w0"


async def test_admission_keeps_at_most_max_unstarted_requests_at_an_engine_that_holds_back() -> (
    None
):
    """A busy worker holds requests back for room (its queue is not empty) and has the two
    requests sent to it (`max_unstarted`, 2) not yet started: a third waits here and is
    answered 429 when its SLO passes. Once they start, requests go."""
    clock = [0.0]
    router, config, table = router_of("cost", workers=1, clock=clock)
    route = dataclasses.replace(config.routes[MODEL], slo_ttft_s=2.0)
    admission = ticking_admission(router, clock)
    holding = EngineLoad(running=5, waiting=1, used_tokens=10_000, max_total_tokens=100_000)
    table.polled("w0", holding, 2)
    tickets = []
    for key in (b"a", b"b"):
        request = router.request(MODEL, SYSTEM + key)
        plan = await admitted(admission, route, request, clock[0])
        tickets.append(router.dispatched(plan.decision.ranked[0], request, wait_s=plan.wait_s))
    assert await overloaded(admission, route, router.request(MODEL, SYSTEM + b"c"), clock[0])
    for ticket in tickets:
        router.first_byte(ticket)
    plan = await admitted(admission, route, router.request(MODEL, SYSTEM + b"d"), clock[0])
    assert plan.decision.ranked[0].worker.id == "w0"


async def test_an_engine_with_room_takes_a_burst_at_once() -> None:
    """A busy worker with room and an empty queue starts a burst together, in one prefill
    batch: six requests sent at the same moment are all admitted, none held back."""
    clock = [0.0]
    router, config, table = router_of("cost", workers=1, clock=clock)
    route = dataclasses.replace(config.routes[MODEL], slo_ttft_s=2.0)
    admission = ticking_admission(router, clock)
    table.polled("w0", EngineLoad(running=5, used_tokens=10_000, max_total_tokens=100_000), 2)
    for key in (b"a", b"b", b"c", b"d", b"e", b"f"):
        request = router.request(MODEL, SYSTEM + key)
        plan = await admitted(admission, route, request, clock[0])
        router.dispatched(plan.decision.ranked[0], request, wait_s=plan.wait_s)
    assert router.views["w0"].unstarted == 6


def test_a_busy_fleet_keeps_a_prefix_where_it_is_cached() -> None:
    """Both engines have had requests queued for seconds; the other's queue is empty at this
    poll. Recomputing the prefix there would delay what queues there next: stay."""
    router, config, table = router_of("cost")
    first = send(router, config, SYSTEM + b"question one")
    other = "w1" if first == "w0" else "w0"
    for view in router.views.values():
        view.inflight = view.queued_tokens = view.sent_since_poll = view.tokens_since_poll = 0
    busy = EngineLoad(running=60, waiting=12, used_tokens=60_000, pending_tokens=12 * 300,
                      max_total_tokens=100_000)  # fmt: skip
    for worker in (first, other):
        table.polled(worker, busy, 2)
        router.views[worker].queue = 12  # what the last seconds' polls saw
    emptied = EngineLoad(running=60, used_tokens=60_000, max_total_tokens=100_000)
    table.polled(other, emptied, 2)
    decision = router.route(config.routes[MODEL], router.request(MODEL, SYSTEM + b"two"), set())
    assert decision.ranked[0].worker.id == first
    # an idle worker is another matter: a hot prefix spreads to it (sglang issue #21199)
    router.views[other].queue = 0
    table.polled(other, EngineLoad(max_total_tokens=100_000), 2)
    decision = router.route(config.routes[MODEL], router.request(MODEL, SYSTEM + b"two"), set())
    assert decision.ranked[0].worker.id == other


def test_cache_aware_balances_when_loads_are_far_apart_as_sglang_does() -> None:
    router, config, _ = router_of("cache_aware")
    first = send(router, config, SYSTEM)
    router.views[first].inflight = 100  # far past balance_abs_threshold 64 and 1.5x
    other = send(router, config, SYSTEM)
    assert other != first


def test_three_failures_eject_a_worker_until_its_breaker_half_opens() -> None:
    router, config, _ = router_of("round_robin")
    request = router.request(MODEL, b"x" * 100)
    for _ in range(3):
        decision = router.route(config.routes[MODEL], request, {"w1"})
        router.failed(router.dispatched(decision.ranked[0], request))
    after = router.route(config.routes[MODEL], request, set())
    assert [c.worker.id for c in after.ranked] == ["w1"]


def test_a_policy_parameter_the_router_lacks_is_refused_on_arrival() -> None:
    snapshot = pb.Snapshot(revision=1, region=pb.RegionInfo(name="r"))
    route = snapshot.routes.add(model=MODEL, policy="cost")
    route.params.update({"max_kv_usage": 3})
    with pytest.raises(SnapshotInvalid, match="max_kv_usage"):
        compile_config(snapshot)
