"""Route receipts: few, recent, and biased to what an operator looks for."""

from __future__ import annotations

from agents.gateway.receipts import KEEP, Receipts
from agents.metrics import Settled


def _served(worker: str = "llama/unified-0", came_from: str = "") -> Settled:
    return Settled(model="llama", tenant="acme", worker=worker, policy="cost",
                  reason="cheapest", came_from=came_from)  # fmt: skip


def test_a_busy_gateway_keeps_about_one_answer_a_second() -> None:
    receipts = Receipts(wall=lambda: 1.7e9)
    for i in range(1000):  # 1,000 requests over 2.5 s
        now = i * 0.0025
        receipts.note(f"r{i}", 200, now - 0.05, now, _served(), None)
    assert [r.request_id for r in receipts.kept] == ["r0", "r400", "r800"]
    first = receipts.kept[0]
    assert (first.served_by, first.policy, first.reason, first.status) == (
        "llama/unified-0",
        "cost",
        "cheapest",
        200,
    )
    assert first.duration_ms == 50.0
    assert first.ttft_ms is None  # not streamed: no first byte of its own


def test_refusals_and_escalations_are_kept_more_often_but_still_bounded() -> None:
    receipts = Receipts()
    receipts.note("ok", 200, 0.0, 0.0, _served(), None)
    receipts.note("too-soon", 429, 0.01, 0.05, _served(worker=""), "queue_full")
    receipts.note("refused", 429, 0.1, 0.15, _served(worker=""), "queue_full")
    receipts.note("calm", 200, 0.2, 0.3, _served(), None)  # an answer, under a second after
    receipts.note("out", 200, 0.3, 0.4, _served(worker="peer:us-east"), None)
    receipts.note("in", 200, 0.5, 0.55, _served(came_from="us-west"), None)
    assert [r.request_id for r in receipts.kept] == ["ok", "refused", "out", "in"]
    assert receipts.kept[1].reason == "queue_full"  # the error's code says why
    for i in range(100):
        receipts.note(f"e{i}", 503, 1 + i, 1 + i, _served(worker=""), "no_healthy_worker")
    assert len(receipts.kept) == KEEP
    assert receipts.kept[-1].request_id == "e99"
