"""The gateway: OpenAI API in, auth, quotas, admission, the router's choice, the engine's bytes
out; a peer region's, on overload or failure, where the fallback rules allow. The only I/O on a
request's path is the call to the engine (or the peer).

The path, one request (agents/gateway/flight.py) taken through its steps: authenticate,
parse, admit, then serve: choose, call (or forward), relay, until an answer settles it.

A request is checked whole before anything is taken for it (its parameters, its prompt and
answer against the model's context, its quota); what it then takes is held by `with` and
given back on every exit (agents/held.py). A worker that fails before the first byte reaches
the client has the request retried on the next worker (agents/gateway/calls.py), unless two
workers that were serving others broke off with it in hand before its first token: such a
request is taken to be what broke them, and goes no further. A worker that fails after has
its answer carried on by another (agents/gateway/carry.py). A fault of the gateway's own is
answered with an OpenAI-shaped 500 with the request id, logged with its traceback, counted.

A tenant's request escalates (agents/gateway/forward.py) only when its model has a fallback
rule for the tenant's tier whose trigger fires: overload (its predicted TTFT here breaks the
rule's threshold or the SLO, too many wait, the queue is full, or every worker is busy or
vetoed) or failure (no worker serves, every attempt failed, or local attempts fail more often
than the rule allows). A peer's request is never escalated again, nor counted here against
its tenant's quota or budgets; nor is the operator's own escalated."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Mapping

import orjson
from aiohttp import web

from agents import tracing
from agents.config import RegionConfig
from agents.gateway import assertion, spans
from agents.gateway.arrival import Arrival
from agents.gateway.calls import EngineCalls
from agents.gateway.carry import Carrier
from agents.gateway.errors import (
    SERVER,
    BadRequest,
    GatewayError,
    InternalError,
    NotReady,
    TenantLimit,
    UnsupportedMediaType,
    refusal_error,
)
from agents.gateway.flight import OPERATOR, Caller, Flight, Trail
from agents.gateway.forced import forced_call_made
from agents.gateway.forward import Forwarder
from agents.gateway.limits import DEFAULT_LIMITS, Limits, read_body
from agents.gateway.quotas import Quotas
from agents.gateway.receipts import Receipts
from agents.gateway.relay import (
    FIRST_AT,
    Answered,
    Broken,
    Cut,
    Outcome,
    Refused,
    Retry,
    Usage,
    Yielded,
    new_id,
)
from agents.gateway.settle import Accounts
from agents.gateway.tiered_path import TieredPath
from agents.gateway.tiers import Tiers
from agents.gateway.upstream import Upstream
from agents.metrics import OPERATIONS, RequestMetrics
from agents.quality.runtime import Quality
from agents.router.audit import audit
from agents.router.escalation import LOAD_HEADER, load_header
from agents.router.plan import Call, Continue, Local, MoveTier, Pair, Peer, Reject
from agents.router.router import Router
from agents.tracing import Tracing

log = logging.getLogger(__name__)
UNTRIED = (Broken, Refused)  # outcomes that say nothing of how local attempts fare
AUDIT_EVERY_S = 1.0
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")  # a client's X-Request-ID: visible ASCII


class Gateway:
    """The request's path, composed: arrival (authenticate, parse), the tiered steps, quotas,
    the router's plan carried out (engine calls, peers, carried streams), the answer
    counted."""

    def __init__(
        self,
        router: Router,
        *,
        operator_token: str | None,
        connect_timeout_s: float = 2.0,
        tracing: Tracing | None = None,
        limits: Limits = DEFAULT_LIMITS,
        quality_guard: bool = True,
    ) -> None:
        self.router = router
        self.books = books = router.books  # every count the agent keeps (agents/books.py)
        self.limits = limits
        self.tracing = tracing
        clock = self.clock = router.clock
        self.admission = router.admission  # the router's: it decides
        self.quotas = Quotas(clock)
        self.escalations = router.escalations
        self.assertions = assertion.Seen()  # the nonces of the escalations accepted here
        self.config: RegionConfig | None = None
        self.operator_token = operator_token
        self._upstream = Upstream(connect_timeout_s)
        self.calls = EngineCalls(router, self.admission, self._upstream)
        self.quality = Quality(router.table, router.views, books=books)
        self.calls.quality = self.quality if quality_guard else None
        self.carrier = Carrier(clock, books)
        self.tiers = Tiers(clock, books)
        self.forwarder = Forwarder(self.escalations, self._upstream, self.carrier, clock)
        self._load: dict[str, tuple[float | None, int]] = {}  # model: (best TTFT, serving)
        self.metrics = RequestMetrics(lambda: self.config.region if self.config else "")
        self.arrival = Arrival(router, self.assertions, self.escalations, operator_token)
        self.tiered = TieredPath(router, self.tiers, clock, self.config_or_refuse, self.serve)
        self.receipts = Receipts()
        self.accounts = Accounts(books, self.metrics, self.receipts, clock, lambda: self.config)
        self.created = int(time.time())  # the models' `created`: when this gateway started
        router.table.on_change(self.admission.notify_all)

    async def close(self) -> None:
        await self._upstream.close()
        await self.tiers.close()

    async def audit_forever(self, every_s: float = AUDIT_EVERY_S) -> None:
        """The router's books checked (agents/router/audit.py), and streams' stalls (carry.py)."""
        while True:
            await asyncio.sleep(every_s)
            self.audit()
            self.carrier.watch()

    def audit(self) -> None:
        if audit(self.router):
            self.admission.notify_all()
        self.quality.review()

    async def evacuate(self, worker: str) -> None:
        """A worker's engine is about to stop with requests running (agents/gateway/carry.py)."""
        view = self.router.views.get(worker)
        await self.carrier.evacuate(worker, lambda: view.inflight if view is not None else 0)

    def configure(self, config: RegionConfig, peer_health: Mapping[str, str] | None = None) -> None:
        self.router.configure(config)
        peers = {p.region for chain in config.fallback for p in chain.peers}
        self.escalations.configure(peers, peer_health or {})
        self.config, self.quotas.budgets.tenants = config, config.tenants

    def headers(self, request_id: str) -> dict[str, str]:
        region = self.config.region if self.config is not None else ""
        return {"X-Request-ID": request_id, "x-meridian-region": region, "Server": SERVER}

    def load_of(self, model: str) -> str:
        """What this region says of its load for the model, on every answer of it."""
        ttft, serving = self._load.get(model, (None, 0))
        return load_header(ttft, self.admission.waiting.get(model, 0), serving)

    async def infer(self, request: web.Request) -> web.StreamResponse:
        started = self.clock()
        given = request.headers.get("X-Request-ID")
        request_id = given if given is not None and _REQUEST_ID.fullmatch(given) else new_id()
        headers = self.headers(request_id)
        trail, error_type = Trail(), None
        fault: BaseException | None = None
        if self.tracing is not None:
            operation = OPERATIONS.get(request.path, "chat")
            trail.span = self.tracing.start(operation, request.headers, time.time_ns())
            # the engine needs the context only of a trace that is kept; a peer gets it always
            # (it follows this region's sampling), made when it escalates
            if trail.span is not None and trail.span.is_recording():
                trail.trace = tracing.context_headers(trail.span)
        try:
            if given is not None and given != request_id:
                raise BadRequest(
                    "X-Request-ID must be 1 to 128 visible ASCII characters", param="x-request-id"
                )
            answered = await self._infer(request, request_id, headers, trail)
        except GatewayError as error:  # a request this gateway does not take: what it says
            answered = error
        except asyncio.CancelledError:  # its client went away (aiohttp cancels the handler)
            self.accounts.gone(request.path, request_id, trail, started)
            raise
        except Exception as error:  # a fault of ours: the client gets an OpenAI-shaped 500
            fault, answered = error, InternalError()
        response: web.StreamResponse
        refused: GatewayError | None = None
        if isinstance(answered, GatewayError):
            refused, error_type = answered, answered.code
            response = self._refused(answered, headers, trail)
        else:
            response = answered
        flight = trail.flight
        fault = fault or (flight.fault if flight is not None else None)
        settled = trail.settled(refused.model if refused is not None else None,
                                response.get(FIRST_AT))  # fmt: skip
        if fault is not None:  # a fault of ours, maybe after its stream began
            self.accounts.fault(request_id, settled.model, fault)
            error_type = InternalError.code
        if flight is not None and flight.client_stalled:
            error_type = "client_stalled"  # counted as such: it was cut, not answered
        self.accounts.settle(
            request.path, request_id, response.status, settled, error_type, started, trail.span
        )
        return response

    def _refused(self, error: GatewayError, headers: dict[str, str], trail: Trail) -> web.Response:
        """An error's answer, counted."""
        caller, flight = trail.caller, trail.flight
        model = flight.model if flight is not None else (error.model or "")
        if error.model is not None and caller is not None and caller.insider:
            headers[LOAD_HEADER] = self.load_of(error.model)
        if error.status in (429, 503) and model:
            self.books.rejections[model, error.code] += 1
        if (
            error.status in (429, 503) and caller is not None and not isinstance(error, TenantLimit)
        ):  # the quota's own are counted there
            self.quotas.demand.tally(caller.tenant.name).refused(error.code)
        return error.response(headers)

    def config_or_refuse(self) -> RegionConfig:
        if self.config is None:
            raise NotReady("this agent has no snapshot yet", retry_after_s=2)
        return self.config

    async def _infer(
        self, request: web.Request, request_id: str, headers: dict[str, str], trail: Trail
    ) -> web.StreamResponse | GatewayError:
        """The whole path, step by step: the answer, or the error that refused it. What it
        makes of the request on the way goes in `trail`."""
        arrived = self.clock()
        config = self.config_or_refuse()
        if request.content_type not in ("application/json", ""):
            raise UnsupportedMediaType(f"send application/json, not {request.content_type}")
        body = await read_body(request, self.limits)
        caller = trail.caller = self.arrival.authenticate(request, config, body, request_id)
        flight = trail.flight = self.arrival.parse(
            request, config, body, caller, request_id, headers, arrived
        )
        flight.span, flight.trace = trail.span, trail.trace
        adapter, keeper = flight.inference.adapter, self.calls.adapters
        if adapter is not None and keeper is not None:
            keeper.used(adapter.name)
        if flight.inference.tiered is not None:
            await self.tiered.tier(flight)
        # everything above only reads; from here on what is taken is held by `with`
        admission = self.router.admission
        charge = await self.quotas.charge(config, flight)
        with charge, admission.hold(flight.model, flight.tenant):
            answered = await self.serve(flight)
            if isinstance(answered, GatewayError):
                charge.used = 0  # refused: only the request counts
                return answered
            response, usage = answered
            if flight.tier is not None:
                response, usage = await self.tiered.cascade(flight, response, usage)
                flight.answer = response, usage
            if usage.prompt_tokens is not None:
                charge.used = usage.prompt_tokens + (usage.completion_tokens or 0)
        if flight.inference.tool_forced is not None:
            forced_call_made(flight.inference, response)
        return response

    async def serve(self, flight: Flight) -> tuple[web.StreamResponse, Usage] | GatewayError:
        """The router's plan carried out, until an answer settles the request: a worker's, a
        peer region's, or a refusal (a started stream ends with it instead)."""
        if flight.inference.stream:
            self.carrier.streams.add(flight)
        try:
            while flight.answer is None:
                tiering = self.tiered.tiering(flight) if flight.tier is not None else None
                plan = await self.router.plan(
                    flight.ask, flight.placement, flight.progress, tiering
                )
                refusal: GatewayError | None = None
                match plan:
                    case MoveTier():
                        self.tiered.move(flight, plan)
                        refusal = await self.call(flight, plan.then)
                    case Local() | Pair() | Continue():
                        refusal = await self.call(flight, plan)
                    case Peer():
                        refusal = await self.escalate(flight, plan)
                    case Reject():
                        refusal = refusal_error(plan)
                if refusal is not None:
                    refusal.model = flight.model
                    if flight.stream is None:
                        return refusal
                    await self.carrier.end(flight, refusal.message)
        finally:
            self.carrier.streams.discard(flight)
        return flight.answer

    async def call(self, flight: Flight, plan: Call) -> GatewayError | None:
        """One worker's go: its answer, or what its failure leaves for the next plan."""
        model, decision = flight.model, plan.decision
        self.router.record(flight.id, decision, plan.wait_s)
        chosen = decision.ranked[0]
        progress = flight.progress
        if progress.admitted_at is None:
            progress.admitted_at = self.clock()
        attempt = progress.attempt(chosen.worker.id)
        self.carrier.carried(flight, attempt.by)
        attempt.policy, attempt.reason = decision.policy, decision.reason
        if flight.trace:  # a trace that is kept
            attempt.attributes = spans.decision_attributes(decision, chosen)
        prompt = attempt.routed_prompt = flight.placement.request.prompt_tokens
        attempt.routed_cached = min(chosen.matched_tokens, prompt)
        self.books.decisions[model, decision.policy, decision.pd or "unified"] += 1
        serving = decision.total - decision.unavailable
        self._load[model] = (decision.best_ttft_s, serving)
        attempt.load = self.router.admission.fair.places(model) / max(1, serving)
        out = self._answer_headers(flight.headers, model, flight.caller)
        if flight.caller.debug:
            queued_ms = round((self.clock() - flight.progress.since) * 1000, 1)  # in admission
            extra: dict[str, object] = {
                "attempt": len(flight.progress.attempts), "queued_ms": queued_ms,
            }  # fmt: skip
            if flight.tier is not None:
                extra["tier"] = flight.tier.describe()
            out["x-meridian-route"] = orjson.dumps(
                decision.describe(chosen.worker.id, wait_s=plan.wait_s) | extra
            ).decode()
        outcome = await self.calls.attempt(flight, plan, out)
        if not isinstance(outcome, UNTRIED):
            self.router.escalations.attempted(model, ok=isinstance(outcome, Answered))
        if isinstance(outcome, Cut):
            await self.cut(flight, outcome)
            return None
        return self.noted(flight, outcome)  # no coroutine for what needs no I/O

    async def cut(self, flight: Flight, cut: Cut) -> None:
        """The answer broke off after the client saw part of it: carried on by the next
        plan, or it ends here."""
        ending = self.carrier.cut(flight, cut)
        if ending is not None:
            await self.carrier.end(flight, ending)

    def noted(self, flight: Flight, outcome: Outcome) -> GatewayError | None:
        """What a worker's (or peer's) go came to, noted for the next plan; an engine's
        refusal is the client's answer."""
        progress = flight.progress
        match outcome:
            case Answered(response, usage):
                flight.answer = response, usage
            case Retry(worker, _, broke):  # before the client saw a byte: the next is tried
                log.warning("request %s: %s", flight.id, outcome, extra={"request_id": flight.id})
                progress.failed(worker, str(outcome), broke, self.clock())
            case Broken(response, cause):  # a fault of ours: the stream ended with an error
                flight.fault = cause
                flight.answer = response, Usage()
            case Refused(error):
                return error
            case Yielded():  # it waits for admission again: no fault of the worker's
                progress.gave_way(self.clock())
        return None

    async def escalate(self, flight: Flight, plan: Peer) -> GatewayError | None:
        """To a peer region, under the tenant's fallback rule; if none takes it, what the plan
        says: a refusal, or (None) another plan without this escalation."""
        headers = self._answer_headers(flight.headers, flight.model, flight.caller)
        trace = spans.peer_context(flight.span, self.tracing)
        config = self.config_or_refuse()
        outcome = await self.forwarder.escalate(
            flight, config, plan.trigger, plan.why, headers, trace
        )
        if isinstance(outcome, Cut):  # the peer's stream broke off: carried on, or it ends
            await self.cut(flight, outcome)
            return None
        if outcome is not None:
            return self.noted(flight, outcome)
        flight.progress.declined.add(plan.reason)
        return refusal_error(plan.otherwise) if plan.otherwise is not None else None

    def _answer_headers(self, headers: dict[str, str], model: str, who: Caller) -> dict[str, str]:
        """The load header to peers (it is how they choose) and insiders; to a tenant's own
        request its quota's `x-ratelimit-*`, as OpenAI sends them, to pace itself by."""
        out = dict(headers)
        if who.insider:
            out[LOAD_HEADER] = self.load_of(model)
        if who.came_from is None and who.tenant is not OPERATOR:
            out.update(self.quotas.rate_limit_headers(who.tenant, who.key))
        return out
