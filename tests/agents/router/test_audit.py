"""The router checks its books against the engines': a request it counts in flight that the
engine has not held for AUDIT_S is ended, once, and counted; one the engine holds, or one
sent too lately for the engine to have it, is left alone."""

from __future__ import annotations

from agents.router.audit import AUDIT_S, audit
from agents.router.decision import Ticket
from agents.router.router import Router
from agents.workers.table import EngineLoad, WorkerTable
from tests.kits.router import MODEL, router_of


def _dispatch(router: Router) -> Ticket:
    """A request sent to w0."""
    assert router.config is not None
    request = router.request(MODEL, b"hello")
    decision = router.route(router.config.routes[MODEL], request, {"w1"})
    return router.dispatched(decision.ranked[0], request)


def _poll(table: WorkerTable, clock: list[float], held: int) -> None:
    for worker in ("w0", "w1"):
        load = EngineLoad(running=held if worker == "w0" else 0, at=clock[0])
        table.polled(worker, load, fail_after=2)


def test_a_slot_the_engine_never_held_is_repaired_after_a_while() -> None:
    clock = [0.0]
    router, _, table = router_of("cost", clock=clock)
    leaked = _dispatch(router)
    served = _dispatch(router)
    repaired: list[tuple[str, int]] = []
    while clock[0] < AUDIT_S + 3:
        clock[0] += 0.5
        _poll(table, clock, held=1)  # the engine runs one of the two: one leaked
        repaired += audit(router)
    assert repaired == [("w0", 1)]
    assert leaked.done  # the oldest is taken to be the leak
    assert not served.done
    assert router.views["w0"].inflight == 1
    assert router.books.repairs["w0"] == 1
    router.finished(served, 5, 1, 1)
    assert router.views["w0"].inflight == 0


def test_requests_the_engine_holds_or_may_not_have_yet_are_left_alone() -> None:
    clock = [0.0]
    router, _, table = router_of("cost", clock=clock)
    for _ in range(3):
        _dispatch(router)
    for _ in range(int(AUDIT_S * 4)):
        clock[0] += 0.5
        _poll(table, clock, held=3)
        assert audit(router) == []
    _dispatch(router)  # sent just now: no poll can have seen it yet
    _poll(table, clock, held=3)
    assert audit(router) == []
    assert router.views["w0"].inflight == 4


def test_a_mismatch_that_comes_and_goes_is_not_repaired() -> None:
    """The engine's count lags (a request it finished while ours is still relayed): a gap
    that closes before AUDIT_S is no leak."""
    clock = [0.0]
    router, _, table = router_of("cost", clock=clock)
    ticket = _dispatch(router)
    for step in range(int(AUDIT_S * 2) + 6):
        clock[0] += 0.5
        _poll(table, clock, held=0 if step % 10 < 5 else 1)
        assert audit(router) == []
    assert not ticket.done


def test_a_stream_still_relayed_after_its_engine_finished_is_alive() -> None:
    """The engine ended the answer, the client reads it slowly: the gateway still relays its
    events, and the slot is the client's until the stream ends."""
    clock = [0.0]
    router, _, table = router_of("cost", clock=clock)
    ticket = _dispatch(router)
    router.first_byte(ticket)
    for _ in range(int(AUDIT_S * 4)):
        clock[0] += 0.5
        router.progressed(ticket, 3)
        _poll(table, clock, held=0)
        assert audit(router) == []
    assert not ticket.done
