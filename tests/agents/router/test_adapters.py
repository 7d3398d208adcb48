"""A request for a LoRA adapter goes where the adapter is held (then where there is room to
load it), whatever the policy's own order, while the holder takes requests; the cost policy
counts a load's time in its predicted TTFT."""

from __future__ import annotations

from agents.engines.contract import ServerInfo
from agents.router.router import Router
from agents.workers.table import EngineLoad, WorkerTable
from tests.kits.router import MODEL, SYSTEM, router_of

ADAPTER = "acme-support"


def _order(router: Router, workers: int, adapter: str | None = ADAPTER) -> list[str]:
    config = router.config
    assert config is not None
    request = router.request(MODEL, SYSTEM + b"hello")
    request.adapter, request.cold_load_s = adapter, 0.5
    decision = router.route(config.routes[MODEL], request, set())
    return [c.worker.id for c in decision.ranked]


def _lora(table: WorkerTable, worker: str, most: int | None, held: dict[str, str]) -> None:
    table.described(worker, ServerInfo(100_000, 1, None, "v", False, True, most))
    table.holds(worker, held)


def test_round_robin_sends_an_adapter_where_it_is_held_then_where_there_is_room() -> None:
    router, _, table = router_of("round_robin", workers=3)
    _lora(table, "w0", 1, {"other": "/o"})  # full: loading there unloads another
    _lora(table, "w1", 1, {})
    _lora(table, "w2", 1, {ADAPTER: "/a"})
    for _ in range(4):  # round robin turns; residency stands first
        assert _order(router, 3) == ["w2", "w1", "w0"]
    firsts = {_order(router, 3, adapter=None)[0] for _ in range(3)}
    assert firsts == {"w0", "w1", "w2"}  # the base model's requests: in turn, as before


def test_the_cost_policy_keeps_to_the_holder_while_it_takes_requests_and_prices_the_load(
) -> None:  # fmt: skip
    router, _, table = router_of("cost", workers=2)
    _lora(table, "w0", None, {ADAPTER: "/a"})
    _lora(table, "w1", None, {})
    busy = EngineLoad(running=4, waiting=1, pending_tokens=20_000, max_total_tokens=100_000)
    table.polled("w0", busy, fail_after=2)
    # a load elsewhere would be sooner for this request; it would unload another adapter
    # there, which a later request waits for: the holder first
    assert _order(router, 2) == ["w0", "w1"]
    config = router.config
    assert config is not None
    request = router.request(MODEL, SYSTEM + b"hello")
    request.adapter, request.cold_load_s = ADAPTER, 0.5
    decision = router.route(config.routes[MODEL], request, set())
    idle = next(c for c in decision.ranked if c.worker.id == "w1")
    assert idle.cold_s == 0.5
    assert idle.ttft_s >= 0.5  # its load counted in its predicted first token
    full = EngineLoad(running=4, waiting=400, max_total_tokens=100_000)
    table.polled("w0", full, fail_after=2)
    assert _order(router, 2) == ["w1"]  # a holder that takes nothing more: loaded elsewhere
