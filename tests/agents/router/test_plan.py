"""The router's plan, decided as pure functions over a table of situations: what stops a
request or sends it to a peer before a worker is looked for (agents/router/plan.py), and what
admission makes of one look at the workers (agents/router/admission.py `judge`). No I/O, no
clock, no event loop: each row is a situation and the plan it must come to."""

from __future__ import annotations

from typing import Any

import pytest
from meridian_pb.fleet.v1.params import CostParams

from agents.config import FallbackChain, Peer, RouteConfig, WorkerSpec
from agents.router.decision import Decision
from agents.router.plan import (
    Ask,
    Continue,
    Local,
    Over,
    Pair,
    Placement,
    Plan,
    Progress,
    Reason,
    Refusal,
    Reject,
    Trigger,
    before_placing,
    over,
    refused,
)
from agents.router.plan import Peer as ToPeer
from agents.router.policies import Candidate, RouteRequest
from agents.router.verdict import Look, judge
from agents.router.view import WorkerView
from agents.workers.table import WorkerEntry

MODEL = "m"
ROUTE = RouteConfig(MODEL, "cost", CostParams(), 2.0, None, None, 8)
EU = Peer("eu", "eu", "http://127.0.0.1:1", frozenset({MODEL}))


def _chain(*triggers: str, ttft_s: float | None = None, depth: int | None = None) -> FallbackChain:
    return FallbackChain("rule", MODEL, None, frozenset(triggers), (EU,), ttft_s, depth)


BOTH, OVERLOAD, FAILURE = _chain("overload", "failure"), _chain("overload"), _chain("failure")
TENANT, OPERATOR, FROM_PEER = (
    Ask("r", "acme"),
    Ask("r", "operator", None, True),
    Ask("r", "acme", "eu"),
)


def _placement(chain: FallbackChain | None) -> Placement:
    return Placement(MODEL, ROUTE, RouteRequest(MODEL, b"k", 10, 0.25), chain)


def _progress(**fields: Any) -> Progress:
    progress = Progress(since=0.0)
    for name, value in fields.items():
        setattr(progress, name, value)
    return progress


def _candidate(worker: str, role: str = "unified") -> Candidate:
    spec = WorkerSpec(worker, MODEL, "d", role, "http://127.0.0.1:2", None)
    return Candidate(spec, WorkerEntry(spec), WorkerView(worker, 10_000, 0.02), ttft_s=0.3)


def _decision(ranked: int = 1, vetoed: int = 0, pd: bool = False) -> Decision:
    decision = Decision(
        "cost", [_candidate(f"w{i}") for i in range(ranked)], "why",
        [_candidate(f"v{i}") for i in range(vetoed)], unavailable=1, total=ranked + vetoed + 1,
        model=MODEL,
    )  # fmt: skip
    if pd:
        decision.pd, decision.prefill = "disaggregated", _candidate("p0", "prefill")
    return decision


@pytest.mark.parametrize(
    ("situation", "ask", "chain", "progress", "failing", "expected"),
    [
        (
            "it broke two workers that served others: it stops, whatever the rule",
            TENANT,
            BOTH,
            {"broken": 2},
            True,
            Reject(
                Refusal.UPSTREAM_FAILED,
                "the request broke 2 workers that were serving others; it is not tried again",
                None,
                Reason.POISONED,
            ),
        ),
        (
            "its stream was carried on twice and broke again: it ends",
            TENANT,
            BOTH,
            {"cuts": 3, "continuing": True},
            False,
            Reject(
                Refusal.UPSTREAM_FAILED,
                "it was carried on 2 times already",
                None,
                Reason.MIGRATIONS,
            ),
        ),
        (
            "three workers failed it and the rule covers failure: a peer, else 502",
            TENANT,
            FAILURE,
            {"failures": 3},
            False,
            ToPeer(
                Trigger.FAILURE,
                Reason.ATTEMPTS,
                "3 workers failed the request",
                Reject(Refusal.UPSTREAM_FAILED, "3 workers failed the request", 1, Reason.ATTEMPTS),
            ),
        ),
        (
            "three workers failed it and the rule covers overload only: 502",
            TENANT,
            OVERLOAD,
            {"failures": 3},
            False,
            Reject(Refusal.UPSTREAM_FAILED, "3 workers failed the request", 1, Reason.ATTEMPTS),
        ),
        (
            "three workers failed a started stream: it goes on in a peer under any rule",
            TENANT,
            OVERLOAD,
            {"failures": 3, "continuing": True},
            False,
            ToPeer(
                Trigger.FAILURE,
                Reason.ATTEMPTS,
                "3 workers failed the request",
                Reject(Refusal.UPSTREAM_FAILED, "3 workers failed the request", 1, Reason.ATTEMPTS),
            ),
        ),
        (
            "three workers failed the operator's request: never escalated",
            OPERATOR,
            BOTH,
            {"failures": 3},
            True,
            Reject(Refusal.UPSTREAM_FAILED, "3 workers failed the request", 1, Reason.ATTEMPTS),
        ),
        (
            "three workers failed a peer's request: one hop only",
            FROM_PEER,
            BOTH,
            {"failures": 3},
            True,
            Reject(Refusal.UPSTREAM_FAILED, "3 workers failed the request", 1, Reason.ATTEMPTS),
        ),
        (
            "its model fails here past the rule's rate: to a peer first, else here",
            TENANT,
            FAILURE,
            {},
            True,
            ToPeer(Trigger.FAILURE, Reason.FAILING, "local attempts fail past the rule's rate"),
        ),
        (
            "failing, but no peer took it a moment ago: placed here",
            TENANT,
            FAILURE,
            {"declined": {Reason.FAILING}},
            True,
            None,
        ),
        (
            "failing, but a worker here is trying it already: placed here",
            TENANT,
            FAILURE,
            {"attempts": ["w0"]},
            True,
            None,
        ),
        (
            "failing, and the rule covers overload only: placed here",
            TENANT,
            OVERLOAD,
            {},
            True,
            None,
        ),
        ("failing, the operator's request: placed here", OPERATOR, FAILURE, {}, True, None),
        ("nothing wrong: placed here", TENANT, BOTH, {}, False, None),
    ],
)
def test_before_a_worker_is_looked_for(
    situation: str,
    ask: Ask,
    chain: FallbackChain,
    progress: dict[str, Any],
    failing: bool,
    expected: Plan | None,
) -> None:
    if "attempts" in progress:
        made = Progress(since=0.0)
        for worker in progress.pop("attempts"):
            made.attempt(worker)
        progress["attempts"] = made.attempts
    assert before_placing(ask, _placement(chain), _progress(**progress), failing) == expected


def _look(**fields: Any) -> Look:
    base: dict[str, Any] = {
        "model": MODEL, "tenant": "acme", "decision": _decision(), "fits": False,
        "wait_s": None, "standing": 0, "under_waiting": False, "waiting": 0, "ahead_s": 0.0,
        "waited_s": 0.1, "left_s": 1.9, "queued": False, "queue": None, "limits": None,
        "tried": 0, "slo_s": 2.0,
    }  # fmt: skip
    return Look(**(base | fields))


FULL = Reject(Refusal.QUEUE_FULL, "m has 8 requests waiting already", 2, Reason.QUEUE_FULL)


@pytest.mark.parametrize(
    ("situation", "look", "expected"),
    [
        (
            "the best worker starts it within the SLO: called, with the wait predicted there",
            _look(fits=True, wait_s=0.4),
            "local",
        ),
        (
            "a PD model's pair: prefill on the prefill worker",
            _look(fits=True, decision=_decision(pd=True)),
            "pair",
        ),
        ("a cut stream's rest: continued", _look(fits=True, continuing=True), "continue"),
        (
            "it fits, but its tenant is over its share while one under it waits: it waits",
            _look(fits=True, standing=1, under_waiting=True),
            None,
        ),
        (
            "it fits, its tenant is over its share, nobody under it waits: called",
            _look(fits=True, standing=1),
            "local",
        ),
        (
            "no worker serves the model: 503 with Retry-After",
            _look(decision=_decision(ranked=0), tried=2),
            Reject(
                Refusal.NO_HEALTHY_WORKER,
                "no worker of m is serving (2 failed it, 1 of 1 unavailable)",
                2,
                Reason.NO_WORKER,
            ),
        ),
        (
            "no engine runs here, it may scale to zero and no peer takes it: it waits for one",
            _look(decision=_decision(ranked=0), waited_s=12.0, left_s=-10.0, waking_s=30.0),
            None,
        ),
        (
            "none started within the wait: 503 with Retry-After",
            _look(decision=_decision(ranked=0), waited_s=30.5, waking_s=30.0),
            Reject(
                Refusal.NO_HEALTHY_WORKER,
                "no engine of m runs here, and none started within 30 s; one is starting",
                10,
                Reason.NO_WORKER,
            ),
        ),
        (
            "every worker is busy or vetoed, past a rule: to a peer before it waits",
            _look(decision=_decision(ranked=0, vetoed=2), limits=Over(1.0, None)),
            ToPeer(Trigger.OVERLOAD, Reason.BUSY, "every worker of the model is busy or vetoed"),
        ),
        (
            "every worker is busy or vetoed, no rule: it waits",
            _look(decision=_decision(ranked=0, vetoed=2)),
            None,
        ),
        (
            "as many wait as the rule's depth: to a peer",
            _look(waiting=4, limits=Over(None, 4)),
            ToPeer(Trigger.OVERLOAD, Reason.QUEUE_DEPTH, "4 requests of the model wait here"),
        ),
        (
            "the rule's depth counts only on joining the queue: queued already, it waits",
            _look(waiting=4, queued=True, limits=Over(None, 4)),
            None,
        ),
        (
            "its predicted TTFT, with what it waited and those ahead, passes the rule's",
            _look(wait_s=0.6, ahead_s=0.4, limits=Over(1.0, None)),
            ToPeer(Trigger.OVERLOAD, Reason.PREDICTED_TTFT, "predicted TTFT here 1100 ms"),
        ),
        ("within the rule's TTFT: it waits here", _look(wait_s=0.6, limits=Over(1.0, None)), None),
        ("the queue is full: 429 at once", _look(queue=FULL), FULL),
        (
            "its SLO passed while it waited: 429 overloaded",
            _look(queued=True, left_s=0.0),
            Reject(
                Refusal.OVERLOADED,
                "no worker of m could start it within 2000 ms",
                2,
                Reason.OVERLOADED,
            ),
        ),
        (
            "its SLO passed while its tenant held more than its share: 429 tenant_share",
            _look(queued=True, left_s=-0.1, standing=1),
            Reject(
                Refusal.TENANT_SHARE,
                "m is saturated here and tenant acme holds more than "
                "its fair share of it; others' requests go first",
                2,
                Reason.TENANT_SHARE,
            ),
        ),
        ("time left: it waits", _look(queued=True), None),
    ],
)
def test_what_admission_makes_of_one_look(situation: str, look: Look, expected: object) -> None:
    plan = judge(look)
    if isinstance(expected, str):
        kind = {"local": Local, "pair": Pair, "continue": Continue}[expected]
        assert isinstance(plan, kind), situation
        assert isinstance(plan, Local | Pair | Continue)
        assert plan.decision is look.decision
        assert plan.wait_s == look.wait_s
        if isinstance(plan, Pair):
            assert plan.prefill is look.decision.prefill
        return
    assert plan == expected, situation


NO_WORKER = Reject(Refusal.NO_HEALTHY_WORKER, "none", 2, Reason.NO_WORKER)
SHARE = Reject(Refusal.TENANT_SHARE, "over", 2, Reason.TENANT_SHARE)


@pytest.mark.parametrize(
    ("situation", "ask", "chain", "continuing", "reject", "expected"),
    [
        (
            "no worker, failure rule: a peer first",
            TENANT,
            FAILURE,
            False,
            NO_WORKER,
            ToPeer(Trigger.FAILURE, Reason.NO_WORKER, "none", NO_WORKER),
        ),
        ("no worker, overload rule: refused", TENANT, OVERLOAD, False, NO_WORKER, NO_WORKER),
        (
            "no worker for a started stream, overload rule: it goes on in a peer",
            TENANT,
            OVERLOAD,
            True,
            NO_WORKER,
            ToPeer(Trigger.FAILURE, Reason.NO_WORKER, "none", NO_WORKER),
        ),
        ("no worker, no rule: refused", TENANT, None, True, NO_WORKER, NO_WORKER),
        (
            "full, overload rule: a peer first",
            TENANT,
            OVERLOAD,
            False,
            FULL,
            ToPeer(Trigger.OVERLOAD, Reason.QUEUE_FULL, FULL.message, FULL),
        ),
        (
            "over its share, overload rule: a peer first",
            TENANT,
            BOTH,
            False,
            SHARE,
            ToPeer(Trigger.OVERLOAD, Reason.TENANT_SHARE, "over", SHARE),
        ),
        ("full, failure rule only: refused", TENANT, FAILURE, False, FULL, FULL),
        ("full, the operator's: refused", OPERATOR, BOTH, False, FULL, FULL),
        ("full, a peer's request: refused (one hop)", FROM_PEER, BOTH, False, FULL, FULL),
    ],
)
def test_a_refusal_goes_to_a_peer_where_the_rule_covers_it(
    situation: str,
    ask: Ask,
    chain: FallbackChain | None,
    continuing: bool,
    reject: Reject,
    expected: Plan,
) -> None:
    progress = _progress(continuing=continuing)
    assert refused(ask, _placement(chain), progress, reject) == expected, situation


def test_the_rules_overload_thresholds_apply_to_a_first_placement_only() -> None:
    ruled = _chain("overload", ttft_s=1.5, depth=3)
    assert over(TENANT, _placement(ruled), _progress()) == Over(1.5, 3)
    # without its own TTFT, the rule takes the route's SLO
    assert over(TENANT, _placement(_chain("overload")), _progress()) == Over(2.0, None)
    tried = _progress()
    tried.attempt("w0")
    assert over(TENANT, _placement(ruled), tried) is None  # after a failed attempt: waits
    assert over(TENANT, _placement(ruled), _progress(declined={Reason.BUSY})) is None
    assert over(OPERATOR, _placement(ruled), _progress()) is None
    assert over(FROM_PEER, _placement(ruled), _progress()) is None
    assert over(TENANT, _placement(FAILURE), _progress()) is None
