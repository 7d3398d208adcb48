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
than the rule allows). A request that came from a peer is never escalated again and is not
counted against the tenant's quota here; the operator's own requests are not escalated.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
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
    QuotaExceeded,
    TenantConcurrency,
    UnsupportedMediaType,
    refusal_error,
)
from agents.gateway.flight import OPERATOR, Flight
from agents.gateway.forced import forced_call_made
from agents.gateway.forward import Forwarder
from agents.gateway.quotas import Charge, Quotas, uncharged
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
    new_id,
)
from agents.gateway.requests import DEFAULT_LIMITS, Limits, read_body
from agents.gateway.tiered_path import TieredPath
from agents.gateway.tiers import Tiers
from agents.gateway.upstream import Upstream
from agents.metrics import CROWDED_OUT, OPERATIONS, RequestMetrics, Served, count_by_tenant
from agents.quality.runtime import Quality
from agents.router.audit import audit
from agents.router.escalation import LOAD_HEADER, load_header
from agents.router.plan import Call, Continue, Local, MoveTier, Pair, Peer, Reject
from agents.router.router import Router
from agents.tracing import Tracing

log = logging.getLogger(__name__)
AUDIT_EVERY_S = 1.0
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")  # a client's X-Request-ID: visible ASCII


class Gateway(Arrival, TieredPath):
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
        self.quality = Quality(router.table, router.views)
        self.calls.quality = self.quality if quality_guard else None
        self.carrier = Carrier(clock=clock)
        self.tiers = Tiers(clock)
        self.forwarder = Forwarder(self.escalations, self._upstream, self.carrier, clock)
        self._load: dict[str, tuple[float | None, int]] = {}  # model: (best TTFT, serving)
        self.metrics = RequestMetrics(lambda: self.config.region if self.config else "")
        self.rejections: Counter[tuple[str, str]] = Counter()  # (model, code)
        self.faults: Counter[str] = Counter()  # requests failed by a fault of ours, by model
        self.answered: Counter[tuple[str, str]] = Counter()  # (model, "ok" or the error's code)
        # (model, tenant, code): the same per tenant, so that a rollout's checks can leave out
        # the tenant that gave the most refusals or errors
        self.by_tenant: Counter[tuple[str, str, str]] = Counter()
        self.by_load: Counter[tuple[str, int, str]] = Counter()  # model, band, what
        self.decisions: Counter[tuple[str, str, str]] = Counter()  # (model, policy, choice)
        self.receipts = Receipts()
        self.created = int(time.time())  # the models' `created`: when this gateway started
        router.table.on_change(self.admission.notify_all)

    async def close(self) -> None:
        await self._upstream.close()
        await self.tiers.close()

    async def audit_forever(self, every_s: float = AUDIT_EVERY_S) -> None:
        """The router's books checked against the engines' (agents/router/audit.py), and the
        streams under way against the stall deadline (agents/gateway/carry.py)."""
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
        self.config = config

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
        served, error_type = Served(), None
        if self.tracing is not None:
            operation = OPERATIONS.get(request.path, "chat")
            served.span = self.tracing.start(operation, request.headers, time.time_ns())
            # the engine needs the context only of a trace that is kept; a peer gets it always
            # (it follows this region's sampling), made when it escalates
            if served.span is not None and served.span.is_recording():
                served.trace = tracing.context_headers(served.span)
        try:
            if given is not None and given != request_id:
                raise BadRequest(
                    "X-Request-ID must be 1 to 128 visible ASCII characters", param="x-request-id"
                )
            answered = await self._infer(request, request_id, headers, served)
        except GatewayError as error:  # a request this gateway does not take: what it says
            answered = error
        except Exception as error:  # a fault of ours: the client gets an OpenAI-shaped 500
            served.fault = error
            answered = InternalError()
        response: web.StreamResponse
        if isinstance(answered, GatewayError):
            response, error_type = self._refused(answered, headers, served), answered.code
        else:
            response = answered
        if served.fault is not None:  # a fault of ours, maybe after its stream began
            self._fault(request_id, served, served.fault)
            error_type = InternalError.code
        served.first_at = response.get(FIRST_AT)
        if served.client_stalled:
            error_type = "client_stalled"  # counted as such: it was cut, not answered
        code = error_type or ("ok" if response.status < 400 else f"http_{response.status}")
        if served.crowded and code in CROWDED_OUT:
            code = "crowded"  # refused for another tenant's load, not the region's own
        self.answered[served.model, code] += 1
        now = self.clock()
        if served.tenant:
            routes = self.config.routes if self.config is not None else {}
            count_by_tenant(self.by_tenant, self.by_load, served, code, started, now, routes)
        self.metrics.answered(request.path, response.status, started, now, served, error_type)
        self.receipts.note(request_id, response.status, started, now, served, error_type)
        if served.span is not None and served.span.is_recording():
            region = self.config.region if self.config else None
            spans.finished(request.path, response.status, served, started, error_type, region)
        return response

    def _refused(
        self, error: GatewayError, headers: dict[str, str], served: Served
    ) -> web.Response:
        """An error's answer, counted."""
        served.model = served.model or error.model or ""
        if error.model is not None and served.insider:
            headers[LOAD_HEADER] = self.load_of(error.model)
        if error.status in (429, 503) and served.model:
            self.rejections[served.model, error.code] += 1
        if (
            error.status in (429, 503)
            and served.tenant
            and not isinstance(error, QuotaExceeded | TenantConcurrency)
        ):
            self.quotas.demand.tally(served.tenant).refused(error.code)  # the quota's: there
        return error.response(headers)

    def _fault(self, request_id: str, served: Served, error: BaseException) -> None:
        """Logged once, with its traceback, and counted; what it held was given back on the
        way out."""
        self.faults[served.model or "unknown"] += 1
        log.error(
            "request %s failed on a fault of the gateway's", request_id,
            exc_info=error, extra={"request_id": request_id},
        )  # fmt: skip

    def config_or_refuse(self) -> RegionConfig:
        if self.config is None:
            raise NotReady("this agent has no snapshot yet", retry_after_s=2)
        return self.config

    async def _infer(
        self, request: web.Request, request_id: str, headers: dict[str, str], served: Served
    ) -> web.StreamResponse | GatewayError:
        """The whole path, step by step: the answer, or the error that refused it."""
        arrived = self.clock()
        config = self.config_or_refuse()
        if request.content_type not in ("application/json", ""):
            raise UnsupportedMediaType(f"send application/json, not {request.content_type}")
        body = await read_body(request, self.limits)
        caller = self.authenticate(request, config, body, request_id, served)
        flight = self.parse(request, config, body, caller, request_id, headers, served, arrived)
        if flight.inference.tiered is not None:
            await self.tier(flight)
        # everything above only reads; from here on what is taken is held by `with`
        hold = self.router.admission.hold(flight.model, flight.tenant)
        with self.admit(flight) as charge, hold:
            answered = await self.serve(flight)
            if isinstance(answered, GatewayError):
                charge.used = 0  # refused: only the request counts
                return answered
            response, usage = answered
            if flight.tier is not None:
                response, usage = await self.cascade(flight, response, usage)
            if usage.prompt_tokens is not None:
                charge.used = usage.prompt_tokens + (usage.completion_tokens or 0)
        served.prompt_tokens, served.cached_tokens = usage.prompt_tokens, usage.cached_tokens
        served.completion_tokens = usage.completion_tokens
        if flight.inference.tool_forced is not None:
            forced_call_made(flight.inference, response)
        return response

    def admit(self, flight: Flight) -> Charge:
        """The tenant's quota: held until the answer settles it. A peer's request was counted
        there; the operator's is not counted."""
        if flight.tenant is OPERATOR or flight.caller.came_from is not None:
            return uncharged(flight.tenant)
        return self.quotas.admit(flight.tenant, flight.placement.request.prompt_tokens)

    async def serve(self, flight: Flight) -> tuple[web.StreamResponse, Usage] | GatewayError:
        """The router's plan carried out, until an answer settles the request: a worker's, a
        peer region's, or a refusal (a started stream ends with it instead)."""
        if flight.inference.stream:
            self.carrier.streams.add(flight)
        try:
            while flight.answer is None:
                plan = await self.router.plan(
                    flight.ask, flight.placement, flight.progress, self.tiering(flight)
                )
                refusal: GatewayError | None = None
                match plan:
                    case MoveTier():
                        self.move(flight, plan)
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
            flight.served.crowded = flight.served.crowded or flight.placement.request.crowded
        return flight.answer

    async def call(self, flight: Flight, plan: Call) -> GatewayError | None:
        """One worker's go: its answer, or what its failure leaves for the next plan."""
        served, model, decision = flight.served, flight.model, plan.decision
        self.router.record(flight.id, decision, plan.wait_s)
        chosen = decision.ranked[0]
        attempt = flight.progress.attempt(chosen.worker.id)
        self.carrier.carried(flight, attempt.by)
        served.worker, served.policy, served.reason = attempt.by, decision.policy, decision.reason
        if served.trace:  # a trace that is kept
            served.decision = spans.decision_attributes(decision, chosen)
        request = flight.placement.request
        served.routed_prompt = request.prompt_tokens
        served.routed_cached = min(chosen.matched_tokens, served.routed_prompt)
        self.decisions[model, decision.policy, decision.pd or "unified"] += 1
        serving = decision.total - decision.unavailable
        self._load[model] = (decision.best_ttft_s, serving)
        served.load = self.router.admission.fair.places(model) / max(1, serving)
        out = self._answer_headers(flight.headers, model, served)
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
        if not isinstance(outcome, Broken | Refused):
            self.router.escalations.attempted(model, ok=isinstance(outcome, Answered))
        return await self.ended(flight, outcome)

    async def ended(self, flight: Flight, outcome: Outcome | Refused) -> GatewayError | None:
        """What a worker's (or peer's) go came to, noted for the next plan; an engine's
        refusal is the client's answer."""
        progress = flight.progress
        match outcome:
            case Answered(response, usage):
                flight.answer = response, usage
            case Retry(worker, _, broke):  # before the client saw a byte: the next is tried
                log.warning("request %s: %s", flight.id, outcome, extra={"request_id": flight.id})
                progress.failed(worker, str(outcome), broke, self.clock())
            case Cut():  # after: carried on by the next, or it ends
                ending = self.carrier.cut(flight, outcome)
                if ending is not None:
                    await self.carrier.end(flight, ending)
            case Broken(response, cause):  # a fault of ours: the stream ended with an error
                flight.served.fault = cause
                flight.answer = response, Usage()
            case Refused(error):
                return error
        return None

    async def escalate(self, flight: Flight, plan: Peer) -> GatewayError | None:
        """To a peer region, under the tenant's fallback rule; if none takes it, what the plan
        says: a refusal, or (None) another plan without this escalation."""
        headers = self._answer_headers(flight.headers, flight.model, flight.served)
        trace = spans.peer_context(flight.served, self.tracing)
        config = self.config_or_refuse()
        outcome = await self.forwarder.escalate(
            flight, config, plan.trigger, plan.why, headers, trace
        )
        if outcome is not None:
            return await self.ended(flight, outcome)
        flight.progress.declined.add(plan.reason)
        return refusal_error(plan.otherwise) if plan.otherwise is not None else None

    def _answer_headers(
        self, headers: dict[str, str], model: str, served: Served
    ) -> dict[str, str]:
        """The load header goes to peers (it is how they choose) and insiders, not tenants."""
        out = dict(headers)
        if served.insider:
            out[LOAD_HEADER] = self.load_of(model)
        return out
