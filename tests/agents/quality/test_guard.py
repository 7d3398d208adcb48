"""Quarantine and readmission: a failing worker is routed around with its evidence, the
model's last worker is alerted on and keeps serving, canaries bring a worker back."""

from __future__ import annotations

from meridian_pb.fleet.v1.judging import DETECTORS, Verdict

from agents.config import WorkerSpec
from agents.quality.guard import FAILS_IN_ROW, PASSES_IN_ROW, Guard
from agents.quality.peers import Finding, Source
from agents.quality.runtime import Quality
from agents.router.view import WorkerView
from agents.workers.table import WorkerTable

MODELS = {"a": "llama", "b": "llama", "c": "llama", "q": "qwen"}


def _finding(worker: str) -> Finding:
    return Finding(worker, "repetition", 0.9, 20, 0.0, 60, ("rid-1", "rid-2"))


def _verdict(worker: str, passed: bool) -> Verdict:
    return Verdict(worker, -0.2 if passed else -0.9, -0.2, -0.25, passed)


def test_a_failing_worker_is_quarantined_with_evidence_and_canaries_readmit_it() -> None:
    guard = Guard()
    guard.set_workers(MODELS)
    guard.findings([_finding("c")], now=10.0)
    assert guard.quarantined == {"c"}
    (event,) = guard.events
    assert (event.kind, event.worker, event.model, event.check) == (
        "quarantined", "c", "llama", "repetition",
    )  # fmt: skip
    assert event.examples == ("rid-1", "rid-2")
    assert event.figure > event.peers_figure
    for i in range(PASSES_IN_ROW - 1):
        guard.canary("river", [_verdict("c", True)], now=20.0 + i)
        assert guard.quarantined == {"c"}
    guard.canary("river", [_verdict("c", False)], now=30.0)  # a failure starts the count anew
    for i in range(PASSES_IN_ROW):
        guard.canary("river", [_verdict("c", True)], now=40.0 + i)
    assert guard.quarantined == frozenset()
    assert guard.events[-1].kind == "readmitted"


def test_canaries_failed_in_a_row_quarantine() -> None:
    guard = Guard()
    guard.set_workers(MODELS)
    for _ in range(FAILS_IN_ROW - 1):
        guard.canary("river", [_verdict("b", False)], now=1.0)
    assert guard.quarantined == frozenset()
    guard.canary("river", [_verdict("b", False)], now=2.0)
    assert guard.quarantined == {"b"}
    assert guard.events[-1].check == "canary:river"


def test_the_last_worker_of_a_model_is_alerted_on_not_quarantined() -> None:
    guard = Guard()
    guard.set_workers(MODELS)
    guard.findings([_finding("q")], now=1.0)  # qwen's only worker
    assert guard.quarantined == frozenset()
    assert [e.kind for e in guard.events] == ["alert"]
    guard.findings([_finding("q")], now=2.0)
    assert len(guard.events) == 1  # once, not every review
    # all of llama's three go bad: the third is the last one serving
    guard.findings([_finding("a"), _finding("b")], now=3.0)
    assert guard.quarantined == {"a", "b"}
    guard.findings([_finding("c")], now=4.0)
    assert guard.quarantined == {"a", "b"}
    assert (guard.events[-1].kind, guard.events[-1].worker) == ("alert", "c")


def test_a_worker_gone_from_the_snapshot_is_forgotten() -> None:
    guard = Guard()
    guard.set_workers(MODELS)
    guard.findings([_finding("c")], now=1.0)
    guard.set_workers({w: m for w, m in MODELS.items() if w != "c"})
    assert guard.quarantined == frozenset()


def test_a_worker_far_slower_than_its_peers_at_the_same_batch_is_alerted_on_not_held() -> None:
    table = WorkerTable()
    table.replace([WorkerSpec(w, "llama", "d", "unified", f"http://{w}", None) for w in "abc"])
    views = {w: WorkerView(w, prefill_tokens_per_s=8000, decode_step_s=0.02, learned=50)
             for w in "abc"}  # fmt: skip
    quality = Quality(table, views)
    views["c"].decode_step_s = 0.04  # twice as slow: other hardware, or busier; no alert
    quality.review()
    assert list(quality.recent) == []
    views["c"].decode_step_s = 0.2  # ten times: beyond what its batch explains
    quality.review()
    quality.review()  # once an episode
    (event,) = quality.recent
    assert (event.kind, event.worker, event.check) == ("alert", "c", "latency")
    assert event.figure > 4 * event.peers_figure
    assert quality.held() == {}  # its answers are right: it stays in rotation
    assert not table.entries["c"].quarantined
    views["c"].decode_step_s = 0.02
    quality.review()
    views["c"].decode_step_s = 0.2
    quality.review()
    assert [e.check for e in quality.recent] == ["latency", "latency"]  # a new episode


def test_a_worker_whose_canaries_pass_is_alerted_on_not_quarantined() -> None:
    """Answers a tenant can shape never outweigh the canaries no tenant controls."""
    guard = Guard()
    guard.set_workers(MODELS)
    guard.canary("river", [_verdict("a", True), _verdict("c", True)], now=1.0)
    for now in (2.0, 3.0):  # found at two reviews: alerted on once
        guard.findings([_finding("c")], now=now)
    assert guard.quarantined == frozenset()
    (event,) = guard.events
    assert (event.kind, event.worker, event.check) == ("alert", "c", "repetition")
    assert "canaries pass" in event.note
    guard.findings([], now=4.0)  # the evidence is gone; a new finding alerts anew
    guard.findings([_finding("c")], now=5.0)
    assert [e.kind for e in guard.events] == ["alert", "alert"]
    guard.canary("river", [_verdict("c", False)], now=6.0)  # its canary fails now
    guard.findings([_finding("c")], now=7.0)
    assert guard.quarantined == {"c"}


def test_readmission_starts_every_peers_record_anew() -> None:
    """What a readmitted worker's peers were flagged for while it was out (a tenant's
    answers, say) is not held against them once it is back."""
    guard = Guard()
    guard.set_workers(MODELS)
    for w in MODELS:
        guard.book.record(w, frozenset({"empty"}), f"{w}-1", Source("t", 1))
    guard.canary("river", [_verdict("b", False)], now=1.0)
    guard.canary("river", [_verdict("b", False)], now=2.0)
    assert guard.quarantined == {"b"}
    for i in range(PASSES_IN_ROW):
        guard.canary("river", [_verdict("b", True)], now=3.0 + i)
    assert guard.quarantined == frozenset()
    assert guard.book.totals(["a", "b", "c"]) == (0, dict.fromkeys(DETECTORS, 0))
    assert guard.book.totals(["q"])[0] == 1  # another model's: kept
