"""The router's decisions over a worker table it is handed: cache affinity without hot spots,
vetoes, SGLang's cache_aware semantics, and the breaker."""

from __future__ import annotations

import pytest
from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents.control.compile import RegionConfig, compile_config
from agents.errors import SnapshotInvalid
from agents.router.router import Router
from agents.workers.table import EngineLoad, WorkerTable

MODEL = "m"
SYSTEM = ("you are a careful assistant who answers in full sentences. " * 40).encode()


def _config(policy: str, workers: int = 2, itl_ms: int | None = None) -> RegionConfig:
    snapshot = pb.Snapshot(
        revision=1,
        region=pb.RegionInfo(name="r", cloud="c", jurisdiction="us"),
        models=[pb.ModelInfo(name=MODEL, context_length=100_000)],
        workers=[
            pb.Worker(id=f"w{i}", model=MODEL, deployment="d", role="unified",
                      url=f"http://127.0.0.1:{30000 + i}")
            for i in range(workers)
        ],
        routes=[pb.Route(model=MODEL, policy=policy, slo_itl_ms=itl_ms)],
    )  # fmt: skip
    return compile_config(snapshot)


def _router(
    policy: str, workers: int = 2, itl_ms: int | None = None
) -> tuple[Router, RegionConfig, WorkerTable]:
    clock = [0.0]
    table = WorkerTable(clock=lambda: clock[0])
    config = _config(policy, workers, itl_ms)
    table.replace(config.workers)
    for worker in config.workers:
        table.polled(worker.id, EngineLoad(max_total_tokens=100_000), fail_after=2)
    router = Router(table, clock=lambda: clock[0])
    router.configure(config)
    return router, config, table


def _send(router: Router, config: RegionConfig, key: bytes) -> str:
    request = router.request(MODEL, key)
    decision = router.route(config.routes[MODEL], request, set())
    chosen = decision.ranked[0]
    router.dispatched(chosen, request)
    return chosen.worker.id


def test_cost_follows_the_cached_prefix_while_the_worker_is_not_busier() -> None:
    router, config, _ = _router("cost")
    first = _send(router, config, SYSTEM + b"question one")
    for ticket_worker in list(router.views.values()):
        ticket_worker.inflight = ticket_worker.queued_tokens = 0  # all finished
        ticket_worker.sent_since_poll = ticket_worker.tokens_since_poll = 0
    again = _send(router, config, SYSTEM + b"question two")
    assert again == first


def test_cost_does_not_hot_spot_one_worker_on_a_single_hot_prefix() -> None:
    """sglang issue #21199: every request shares one prefix; a router gated on request counts
    piles them on one worker. Queued work there makes the other cheaper, once it outweighs
    recomputing the prefix on the other (at `miss_weight` 1, twice its prefill)."""
    router, config, _ = _router("cost")
    questions = [f"question {i}: ".encode() + b"please say more about it " * 8 for i in range(60)]
    chosen = [_send(router, config, SYSTEM + q) for q in questions]
    assert set(chosen) == {"w0", "w1"}
    assert min(chosen.count("w0"), chosen.count("w1")) >= 15


def test_a_full_kv_pool_vetoes_a_worker() -> None:
    router, config, table = _router("cost")
    table.polled("w0", EngineLoad(used_tokens=99_000, max_total_tokens=100_000), fail_after=2)
    request = router.request(MODEL, SYSTEM)
    decision = router.route(config.routes[MODEL], request, set())
    assert [c.worker.id for c in decision.ranked] == ["w1"]
    assert "kv usage" in decision.vetoed[0].veto


def test_a_busy_worker_whose_decode_step_is_past_the_itl_slo_takes_no_more_work() -> None:
    """The other face of a hot spot: the cached worker's batch has grown until its tokens come
    slower than the SLO allows; more work there would break the SLO of all it runs."""
    router, config, table = _router("cost", itl_ms=50)
    first = _send(router, config, SYSTEM + b"question one")
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
    """Its prefill queue is empty, but 20 requests wait for room in its KV pool: each needs a
    running request to finish first."""
    router, config, table = _router("cost")
    first = _send(router, config, SYSTEM + b"question one")
    for view in router.views.values():
        view.inflight = view.queued_tokens = view.sent_since_poll = view.tokens_since_poll = 0
    table.polled(first, EngineLoad(running=50, waiting=20, max_total_tokens=100_000), 2)
    decision = router.route(config.routes[MODEL], router.request(MODEL, SYSTEM + b"two"), set())
    assert decision.ranked[0].worker.id != first
    held = next(c for c in decision.ranked if c.worker.id == first)
    assert held.ttft_s > 20 * 128 * 0.01 / 50  # waiting x answer x step / running


def test_cache_aware_balances_when_loads_are_far_apart_as_sglang_does() -> None:
    router, config, _ = _router("cache_aware")
    first = _send(router, config, SYSTEM)
    router.views[first].inflight = 100  # far past balance_abs_threshold 64 and 1.5x
    other = _send(router, config, SYSTEM)
    assert other != first


def test_three_failures_eject_a_worker_until_its_breaker_half_opens() -> None:
    router, config, _ = _router("round_robin")
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
