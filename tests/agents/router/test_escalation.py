"""Which peer an escalated request goes to: the chain's peers that serve the model and that the
tenant's residency allows, not known to be down, the lowest predicted TTFT with the round trip
first, near ties to the chain's order; a peer that fails is passed over until it is probed."""

from __future__ import annotations

import pytest

from agents.config import FallbackChain, Peer
from agents.router.escalation import Escalations, load_header

CHAIN = FallbackChain(
    rule="out",
    model=None,
    tenant_tier=None,
    triggers=frozenset({"overload", "failure"}),
    peers=(
        Peer("near", "us", "http://near", frozenset({"m"})),
        Peer("far", "us", "http://far", frozenset({"m"})),
        Peer("eu", "eu", "http://eu", frozenset({"m"})),
        Peer("other", "us", "http://other", frozenset({"x"})),
    ),
)


def _escalations(now: list[float]) -> Escalations:
    escalations = Escalations(clock=lambda: now[0])
    escalations.configure([p.region for p in CHAIN.peers], {})
    return escalations


def _order(escalations: Escalations, jurisdictions: frozenset[str] | None = None) -> list[str]:
    return [c.peer.region for c in escalations.candidates(CHAIN, "m", jurisdictions)]


def _answer(e: Escalations, peer: str, status: int, rtt_s: float, ttft_ms: float) -> None:
    e.answered(peer, "m", status=status, elapsed_s=rtt_s + 0.5, server_s=0.5,
               load=load_header(ttft_ms / 1000, 0, 1))  # fmt: skip


def test_the_chain_order_decides_until_something_is_known() -> None:
    escalations = _escalations([0.0])
    assert _order(escalations) == ["near", "far", "eu"]  # "other" lacks the model
    assert _order(escalations, frozenset({"eu"})) == ["eu"]  # residency


def test_the_lowest_predicted_ttft_with_the_round_trip_wins_and_near_ties_keep_the_order() -> None:
    escalations = _escalations([0.0])
    _answer(escalations, "near", 200, rtt_s=0.010, ttft_ms=400)
    _answer(escalations, "far", 200, rtt_s=0.080, ttft_ms=30)
    us = frozenset({"us"})
    assert _order(escalations, us) == ["far", "near"]  # 0.11 s against 0.41 s
    _answer(escalations, "near", 200, rtt_s=0.010, ttft_ms=90)
    assert _order(escalations, us) == ["near", "far"]  # within 50 ms: the chain's order
    # one not measured yet is taken to be as far as the others on average, with no wait
    assert _order(escalations) == ["eu", "near", "far"]


def test_a_full_peer_waits_and_a_failing_one_is_ejected_then_probed() -> None:
    now = [0.0]
    escalations = _escalations(now)
    _answer(escalations, "near", 429, rtt_s=0.01, ttft_ms=900)
    assert "near" not in _order(escalations)  # it said it is full
    now[0] = 2.0
    assert "near" in _order(escalations)
    for _ in range(3):
        escalations.unreachable("far")
    assert "far" not in _order(escalations)
    now[0] = 4.5  # the breaker's cooldown has passed: one probe may go
    assert "far" in _order(escalations)
    with escalations.sending("far", "overload"):
        assert "far" not in _order(escalations)  # one probe at a time
        _answer(escalations, "far", 200, rtt_s=0.01, ttft_ms=10)
    assert "far" in _order(escalations)


def test_a_probe_that_ends_without_a_verdict_frees_the_peer() -> None:
    now = [0.0]
    escalations = _escalations(now)
    for _ in range(3):
        escalations.unreachable("far")
    now[0] = 2.5
    assert "far" in _order(escalations)  # one probe may go
    probe = escalations.sending("far", "overload")
    assert "far" not in _order(escalations)
    with pytest.raises(RuntimeError), probe:
        raise RuntimeError("a fault of the gateway's, not the peer's")
    assert "far" in _order(escalations)  # probed again, not shunned for ever
    assert escalations.peers["far"].inflight == 0


def test_a_peer_the_control_plane_calls_down_is_skipped_until_it_answers() -> None:
    now = [0.0]
    escalations = Escalations(clock=lambda: now[0])
    escalations.configure([p.region for p in CHAIN.peers], {"near": "down"})
    assert _order(escalations)[0] == "far"
    _answer(escalations, "near", 200, rtt_s=0.01, ttft_ms=10)
    assert _order(escalations)[0] == "near"


def test_local_failures_past_the_rule_s_rate_trigger_escalation() -> None:
    escalations = _escalations([0.0])
    chain = FallbackChain("out", None, None, frozenset({"failure"}), CHAIN.peers, error_rate=0.5)
    for _ in range(10):
        escalations.attempted("m", ok=True)
    assert not escalations.failing(chain, "m")
    for _ in range(20):
        escalations.attempted("m", ok=False)
    assert escalations.failing(chain, "m")


def test_a_list_chosen_before_another_request_took_the_probe_sends_no_second_one() -> None:
    now = [0.0]
    escalations = _escalations(now)
    for _ in range(3):
        escalations.unreachable("far")
    now[0] = 2.5
    stale = _order(escalations)  # one request's list, "far" on it, while it tries "near" first
    assert "far" in stale
    with escalations.sending("far", "overload"):  # another request took the one probe
        assert not escalations.still_usable("far", "m")  # so the first passes "far" over
        assert escalations.still_usable("near", "m")
    escalations.unreachable("far")  # the probe failed: closed again, for longer
    now[0] = 5.0
    assert not escalations.still_usable("far", "m")


def test_a_try_sent_before_the_breaker_opened_ending_frees_no_second_probe() -> None:
    now = [0.0]
    escalations = _escalations(now)
    early = escalations.sending("far", "overload")  # sent while it still looked well
    for _ in range(3):
        escalations.unreachable("far")
    now[0] = 2.5
    assert escalations.still_usable("far", "m")
    with escalations.sending("far", "overload"):  # the one probe
        with pytest.raises(RuntimeError), early:  # the early try ends with no verdict
            raise RuntimeError("a fault of the gateway's")
        assert not escalations.still_usable("far", "m")  # the probe is still the only one
