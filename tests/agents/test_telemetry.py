"""What the heartbeat tells of each model's answers per tenant: the tenants with the most answers
that were not "ok", then with the most answers, so that a rollout's checks can leave out the one
that gave the most (controlplane/services/rollouts/judge.py); and its timed answers by the load they
met."""

from __future__ import annotations

from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents.books import Books
from agents.gateway.receipts import Receipts
from agents.gateway.settle import Accounts
from agents.metrics import RequestMetrics, Settled
from agents.telemetry import TENANTS_TOLD, TelemetryWindow, add_tenant_answers


def test_the_tenants_with_the_most_answers_not_ok_are_told_per_model() -> None:
    books = Books()
    by_tenant = books.by_tenant
    by_tenant["llama", "acme", "ok"] = 40
    by_tenant["llama", "acme", "queue_full"] = 30
    by_tenant["llama", "beta", "ok"] = 100  # nothing went wrong for beta: no room for it
    for i in range(TENANTS_TOLD + 4):
        by_tenant["llama", f"t{i}", "overloaded"] = i + 1
    by_tenant["qwen", "acme", "internal_error"] = 2
    telemetry = pb.Telemetry(answers=[pb.ModelAnswers(model="llama"),
                                      pb.ModelAnswers(model="qwen")])  # fmt: skip
    by_load = books.by_load
    by_load["llama", 4, "ttft_timed"] = 12
    by_load["llama", 4, "ttft_slow"] = 3
    by_load["llama", 1, "itl_timed"] = 7
    add_tenant_answers(telemetry, books)
    llama, qwen = telemetry.answers
    assert [(b.band, b.ttft_timed, b.ttft_slow, b.itl_timed) for b in llama.bands] == [
        (1, 0, 0, 7), (4, 12, 3, 0)]  # fmt: skip
    assert not qwen.bands
    told = {t.tenant: (t.total, dict(t.by_code)) for t in llama.tenants}
    assert len(told) == TENANTS_TOLD
    assert told["acme"] == (70, {"queue_full": 30})
    assert "beta" not in told
    assert "t0" not in told  # the fewest
    assert not llama.tenants_all
    assert [(t.tenant, dict(t.by_code)) for t in qwen.tenants] == [("acme", {"internal_error": 2})]
    assert qwen.tenants_all


def test_a_tenant_is_told_from_its_first_answer_while_there_is_room() -> None:
    """Not from its first refusal: told then with all its answers since the start, a reader
    of two heartbeats would count them all between the two (and a rollout's checks, leaving
    out the tenant that gave the most refusals, would find no one else's answers left)."""
    books = Books()
    books.by_tenant["llama", "acme", "ok"] = 40
    books.by_tenant["llama", "beta", "ok"] = 100
    books.by_tenant["llama", "beta", "@timed"] = 100
    books.by_tenant["llama", "gamma", "queue_full"] = 1
    telemetry = pb.Telemetry(answers=[pb.ModelAnswers(model="llama")])
    add_tenant_answers(telemetry, books)
    (llama,) = telemetry.answers
    told = [(t.tenant, t.total, dict(t.by_code)) for t in llama.tenants]
    assert told == [("gamma", 1, {"queue_full": 1}), ("beta", 100, {"@timed": 100}),
                    ("acme", 40, {})]  # fmt: skip
    assert llama.tenants_all


def test_answers_to_requests_a_peer_escalated_here_are_told_apart() -> None:
    """A peer region's clients' demand: the capacity planner plans it where it was asked."""
    books = Books()
    accounts = Accounts(books, RequestMetrics(lambda: "us-east"), Receipts(), lambda: 1.0,
                        lambda: None)  # fmt: skip
    for came_from, code in (("", None), ("", None), ("us-west", None), ("us-west", "queue_full")):
        settled = Settled("llama", "acme", came_from=came_from)
        accounts.settle("/v1/chat/completions", "r", 429 if code else 200, settled, code, 0.5,
                        None)  # fmt: skip
    (llama,) = TelemetryWindow().report([], [], [], books=books).answers
    assert dict(llama.total_by_code) == {"ok": 3, "queue_full": 1}
    assert dict(llama.received_by_code) == {"ok": 1, "queue_full": 1}
