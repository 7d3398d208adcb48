"""A request's end, counted once, from what it came to (`Settled`, agents/gateway/flight.py):
its answer in the books (by code, per tenant and by the load it met), its metrics, its route
receipt and its span. A fault of the gateway's own is logged here with its traceback."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from agents.books import Books
from agents.config import RegionConfig
from agents.gateway import spans
from agents.gateway.flight import ESCALATION, Trail
from agents.gateway.receipts import Receipts
from agents.gateway.relay import FIRST_AT
from agents.ledger.record import CLIENT_GONE, Ledger, spent
from agents.metrics import CROWDED_OUT, RequestMetrics, Settled, count_by_tenant

log = logging.getLogger(__name__)


class Accounts:
    def __init__(
        self,
        books: Books,
        metrics: RequestMetrics,
        receipts: Receipts,
        clock: Callable[[], float],
        config: Callable[[], RegionConfig | None],
    ) -> None:
        self.books, self.metrics, self.receipts = books, metrics, receipts
        self.clock, self.config = clock, config
        self.ledger: Ledger | None = None  # the usage ledger's journal, where the agent keeps one

    def settle(
        self,
        path: str,
        request_id: str,
        status: int,
        settled: Settled,
        error_type: str | None,
        started: float,
        span: Any,
    ) -> None:
        """`error_type`: the code of the error that answered it, if one did."""
        books, config = self.books, self.config()
        code = error_type or ("ok" if status < 400 else f"http_{status}")
        if settled.crowded and code in CROWDED_OUT:
            code = "crowded"  # refused for another tenant's load, not the region's own
        books.answered[settled.model, code] += 1
        if settled.came_from:
            books.received[settled.model, code] += 1
        outcome = class_outcome(settled, code)
        if outcome:
            books.classes[settled.model, settled.service_class, outcome] += 1
        now = self.clock()
        routes = config.routes if config is not None else {}
        if outcome == "admitted" and settled.first_at is not None:
            route = routes.get(settled.model)
            slo = route.slo_ttft_s if route is not None else None
            if slo is not None and settled.first_at - started > slo:
                books.classes[settled.model, settled.service_class, "past_slo"] += 1
        if settled.tenant:
            count_by_tenant(books.by_tenant, books.by_load, settled, code, started, now, routes)
        self.metrics.answered(path, status, started, now, settled, error_type)
        self.receipts.note(request_id, status, started, now, settled, error_type)
        if self.ledger is not None and config is not None:
            self.ledger.note(request_id, config, status, settled, code, started, now)
        if settled.hold is not None:  # its budgets' reservation (agents/gateway/budgets.py)
            at = time.time() - (now - started)  # priced at its start, as its record is
            unseen = (settled.prompt_tokens or 0) - settled.routed_prompt
            settled.hold.settle(spent(config, settled, at) if config is not None else None, unseen)
        if span is not None and span.is_recording():
            region = config.region if config is not None else None
            spans.finished(span, path, status, settled, started, error_type, region)

    def gone(self, path: str, request_id: str, trail: Trail, started: float) -> None:
        """A request whose client left before its answer ended, settled as such (499, as
        nginx says it): what it held was given back on the way out; its usage is what its
        client got, and a peer's answer coming then is the peer's to record."""
        flight = trail.flight
        stream = flight.stream if flight is not None else None
        first_at = stream.response.get(FIRST_AT) if stream is not None else None
        if flight is not None and stream is not None and flight.progress.attempts:
            last = flight.progress.attempts[-1]
            if not last.policy and last.by.startswith("peer:"):
                last.policy = ESCALATION
        try:  # called as the request is cancelled: a fault here must not hide the cancel
            settled = trail.settled(None, first_at)
            self.settle(path, request_id, CLIENT_GONE, settled, "client_gone", started,
                        trail.span)  # fmt: skip
        except Exception as error:
            if flight is not None and flight.hold is not None:
                flight.hold.settle(None)  # its budgets' reservation, spent whole: never held on
            self.fault(request_id, flight.model if flight is not None else "", error)

    def fault(self, request_id: str, model: str, error: BaseException) -> None:
        """Logged once, with its traceback, and counted; what it held was given back on the
        way out."""
        self.books.faults[model or "unknown"] += 1
        log.error(
            "request %s failed on a fault of the gateway's", request_id,
            exc_info=error, extra={"request_id": request_id},
        )  # fmt: skip


SHED = frozenset({"class_shed", "overloaded", "queue_full", "tenant_share", "crowded"})
REFUSED = frozenset({"no_healthy_worker", "upstream_failed"})


def class_outcome(settled: Settled, code: str) -> str:
    """What its class's books count it as: escalated, admitted (sent to a worker here),
    preempted, shed (refused for load) or refused (no worker could take it); "" for a
    request refused before it was placed (bad input, a quota)."""
    if settled.policy == ESCALATION:
        return "escalated"
    if code == "preempted":
        return "preempted"
    if settled.waited_s is not None:
        return "admitted"
    if code in SHED:
        return "shed"
    return "refused" if code in REFUSED else ""
