"""The gateway: OpenAI API in, auth, quotas, admission, the router's choice, the engine's bytes
out; a peer region's, on overload or failure, where the fallback rules allow. The only I/O on a
request's path is the call to the engine (or the peer).

A request is checked whole before anything is taken for it (its parameters, its prompt and
answer against the model's context, its quota); what it then takes is held by `with` and
given back on every exit (agents/held.py). A worker that fails before the first byte reaches
the client has the request retried on the next worker (agents/gateway/calls.py), unless two
workers that were serving others broke off with it in hand: such a request is taken to be
what broke them, and goes no further. A fault of the gateway's own is answered with an
OpenAI-shaped 500 that carries the request id, logged once with its traceback and counted.

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
from collections.abc import Callable, Mapping

import orjson
from aiohttp import web

from agents import tracing
from agents.control.compile import FallbackChain, RegionConfig, RouteConfig, Tenant
from agents.gateway import assertion, auth, spans
from agents.gateway.admission import Admission, Escalate, EscalateOver
from agents.gateway.calls import EngineCalls
from agents.gateway.errors import (
    SERVER,
    BadRequest,
    GatewayError,
    InternalError,
    NoHealthyWorker,
    NotReady,
    Overloaded,
    QueueFull,
    UnsupportedMediaType,
    UpstreamFailed,
)
from agents.gateway.forward import Forwarder
from agents.gateway.quotas import Quotas, uncharged
from agents.gateway.receipts import Receipts
from agents.gateway.relay import FIRST_AT, Broken, Retry, Usage, new_id
from agents.gateway.requests import (
    DEFAULT_LIMITS,
    Inference,
    Limits,
    check_context,
    parse,
    read_body,
)
from agents.gateway.upstream import Upstream
from agents.metrics import OPERATIONS, RequestMetrics, Served
from agents.router.audit import AUDIT_S, audit
from agents.router.escalation import LOAD_HEADER, Escalations, load_header
from agents.router.policies import RouteRequest
from agents.router.router import Router
from agents.tracing import Tracing

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 3
POISONED_AFTER = 2  # workers broken by one request: it is taken to be the cause, and stops
AUDIT_EVERY_S = 1.0
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")  # a client's X-Request-ID: visible ASCII


OPERATOR = Tenant("operator", "operator", None, None, None)


class Gateway:
    def __init__(
        self,
        router: Router,
        *,
        operator_token: str | None,
        connect_timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        tracing: Tracing | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.router = router
        self.limits = limits
        self.tracing = tracing
        self.admission = Admission(router, clock)
        self.quotas = Quotas(clock)
        self.escalations = Escalations(clock)
        self.assertions = assertion.Seen()  # the nonces of the escalations accepted here
        self.config: RegionConfig | None = None
        self.operator_token = operator_token
        self.clock = clock
        self._upstream = Upstream(connect_timeout_s)
        self.calls = EngineCalls(router, self.admission, self._upstream)
        self.forwarder = Forwarder(self.escalations, self._upstream, clock)
        self._load: dict[str, tuple[float | None, int]] = {}  # model: (best TTFT, serving)
        self.metrics = RequestMetrics(lambda: self.config.region if self.config else "")
        self.rejections: Counter[tuple[str, str]] = Counter()  # (model, code)
        self.faults: Counter[str] = Counter()  # requests failed by a fault of ours, by model
        self.answered: Counter[tuple[str, str]] = Counter()  # (model, "ok" or the error's code)
        self.decisions: Counter[tuple[str, str, str]] = Counter()  # (model, policy, choice)
        self.receipts = Receipts()
        self.created = int(time.time())  # the models' `created`: when this gateway started
        router.table.on_change(self.admission.notify_all)

    async def close(self) -> None:
        await self._upstream.close()

    async def audit_forever(self, every_s: float = AUDIT_EVERY_S) -> None:
        """The router's books checked against the engines' (agents/router/audit.py)."""
        while True:
            await asyncio.sleep(every_s)
            self.audit()

    def audit(self) -> None:
        repaired = audit(self.router)
        for worker, ended in repaired:
            log.warning(
                "worker %s: %d request(s) in flight from here that its engine has not held "
                "for %.0f s were ended: a reservation leaked, and is repaired",
                worker, ended, AUDIT_S, extra={"worker": worker},
            )  # fmt: skip
        if repaired:
            self.admission.notify_all()

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
            response = await self._infer(request, request_id, headers, served)
        except GatewayError as error:
            served.model = served.model or error.model or ""
            if error.model is not None and served.insider:
                headers[LOAD_HEADER] = self.load_of(error.model)
            if error.status in (429, 503) and served.model:
                self.rejections[served.model, error.code] += 1
            response, error_type = error.response(headers), error.code
        except Broken as broken:  # a fault of ours after the stream began: it ended with an error
            self._fault(request_id, served, broken.__cause__ or broken)
            response, error_type = broken.response, InternalError.code
        except Exception as error:  # a fault of ours: the client gets an OpenAI-shaped 500
            self._fault(request_id, served, error)
            response, error_type = InternalError().response(headers), InternalError.code
        served.first_at = response.get(FIRST_AT)
        code = error_type or ("ok" if response.status < 400 else f"http_{response.status}")
        self.answered[served.model, code] += 1
        now = self.clock()
        self.metrics.answered(request.path, response.status, started, now, served, error_type)
        self.receipts.note(request_id, response.status, started, now, served, error_type)
        if served.span is not None and served.span.is_recording():
            region = self.config.region if self.config else None
            spans.finished(request.path, response.status, served, started, error_type, region)
        return response

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

    def caller(self, request: web.Request, config: RegionConfig) -> tuple[Tenant, bool]:
        """The tenant, and whether it may see the fleet's inside."""
        header = request.headers.get("Authorization")
        if self.operator_token and auth.same_secret(auth.bearer(header), self.operator_token):
            return OPERATOR, True
        tenant = auth.authenticate(header, config)
        return tenant, tenant.debug_routes

    async def _infer(
        self, request: web.Request, request_id: str, headers: dict[str, str], served: Served
    ) -> web.StreamResponse:
        since = arrived = self.clock()
        config = self.config_or_refuse()
        if request.content_type not in ("application/json", ""):
            raise UnsupportedMediaType(f"send application/json, not {request.content_type}")
        body = await read_body(request, self.limits)
        signed = request.headers.get(assertion.HEADER)
        came_from: str | None = None
        if signed is not None:  # escalated here by a peer region: its word for who asks
            claim = assertion.verify(
                signed, config, body=body, request_id=request_id, seen=self.assertions
            )
            tenant, came_from = claim.tenant, claim.origin
            served.came_from = came_from
            debug, served.insider = claim.debug, True
            self.escalations.received(claim.origin, claim.reason)
            # the SLO is the client's, end to end: what it waited there counts here
            since -= claim.waited_s
        else:
            tenant, insider = self.caller(request, config)
            served.insider = insider
            debug = insider and request.headers.get("x-meridian-debug") == "1"
        served.tenant = tenant.name
        inference, model = parse(request.path, body, config)
        served.model = model.name
        route_request = self.router.request(
            model.name, inference.key, inference.tokens, inference.max_new
        )
        check_context(model, route_request.prompt_tokens, inference.max_new)
        route = config.routes.get(model.name)
        if route is None:
            raise UpstreamFailed(f"region {config.region} has no route for {model.name}")
        chain = None
        if came_from is None:
            chain = config.chain(model.name, tenant.tier)
        # everything above only reads; from here on what is taken is held by `with`
        counted = tenant is not OPERATOR and came_from is None  # a peer's was counted there
        charge = (
            self.quotas.admit(tenant, route_request.prompt_tokens) if counted else uncharged(tenant)
        )
        with charge:
            try:
                response, usage = await self._serve(
                    request, body, inference, route_request, route, config, chain, tenant,
                    request_id, headers, debug, (since, arrived), came_from, served,
                )  # fmt: skip
            except GatewayError as error:
                error.model = model.name
                raise
            if usage.prompt_tokens is not None:
                charge.used = usage.prompt_tokens + (usage.completion_tokens or 0)
        served.prompt_tokens, served.cached_tokens = usage.prompt_tokens, usage.cached_tokens
        served.completion_tokens = usage.completion_tokens
        return response

    async def _serve(
        self,
        request: web.Request,
        body: bytes,
        inference: Inference,
        route_request: RouteRequest,
        route: RouteConfig,
        config: RegionConfig,
        chain: FallbackChain | None,
        tenant: Tenant,
        request_id: str,
        headers: dict[str, str],
        debug: bool,
        times: tuple[float, float],
        came_from: str | None,
        served: Served,
    ) -> tuple[web.StreamResponse, Usage]:
        """`times`: since when the SLO counts (earlier for a request a peer escalated here),
        and when the request came here."""
        since, arrived = times
        model = route.model
        overload = chain is not None and "overload" in chain.triggers
        failure = chain is not None and "failure" in chain.triggers
        over = None
        if overload:
            assert chain is not None
            over = EscalateOver(chain.ttft_s or route.slo_ttft_s, chain.queue_depth)

        async def escalate(reason: str, why: str) -> tuple[web.StreamResponse, Usage] | None:
            assert chain is not None
            outcome = await self.forwarder.forward(
                request, body, config=config, chain=chain, model=model,
                tenant=None if tenant is OPERATOR else tenant, reason=reason, why=why,
                waited_s=self.clock() - arrived,
                request_id=request_id, debug=debug, stream=inference.stream,
                trace=spans.peer_context(served, self.tracing),
                native=inference.native, wants_usage=inference.wants_usage,
                headers=self._answer_headers(headers, model, served),
            )  # fmt: skip
            log.debug("request %s escalated (%s: %s) to %s", request_id, reason, why,
                     outcome.peer or f"no peer: {outcome.refused or 'none allowed'}")  # fmt: skip
            if outcome.response is None:
                return None
            served.worker = f"peer:{outcome.peer}"
            served.policy, served.reason = "escalation", f"{reason}: {why}"
            served.decision = {"meridian.escalated": True, "meridian.escalation.reason": reason,
                               "meridian.escalation.why": why, "meridian.peer": outcome.peer,
                               "meridian.escalation.rule": chain.rule}  # fmt: skip
            return outcome.response, outcome.usage or Usage()

        if failure and chain is not None and self.escalations.failing(chain, model):
            done = await escalate("failure", "local attempts fail past the rule's error rate")
            if done is not None:
                return done
        tried: set[str] = set()
        broken = 0  # workers that broke off with this request in hand
        for attempt in range(MAX_ATTEMPTS):
            try:
                decision = await self.admission.place(route, route_request, tried, since, over)
            except Escalate as why:
                done = await escalate("overload", why.why)
                if done is not None:
                    return done
                over = None  # no peer took it: it waits here, as it would without a rule
                decision = await self.admission.place(route, route_request, tried, since)
            except (QueueFull, Overloaded) as error:
                done = await escalate("overload", error.message) if overload else None
                if done is None:
                    raise
                return done
            except NoHealthyWorker as error:
                done = await escalate("failure", error.message) if failure else None
                if done is None:
                    raise
                return done
            self.router.record(request_id, decision)
            chosen = decision.ranked[0]
            served.worker = chosen.worker.id
            served.policy, served.reason = decision.policy, decision.reason
            if served.trace:  # a trace that is kept
                served.decision = spans.decision_attributes(decision, chosen)
            served.routed_prompt, served.routed_cached = (
                route_request.prompt_tokens,
                min(chosen.matched_tokens, route_request.prompt_tokens),
            )
            self.decisions[model, decision.policy, decision.pd or "unified"] += 1
            self._load[model] = (decision.best_ttft_s, decision.total - decision.unavailable)
            out = self._answer_headers(headers, model, served)
            if debug:
                queued_ms = round((self.clock() - since) * 1000, 1)  # in admission
                extra = {"attempt": attempt + 1, "queued_ms": queued_ms}
                out["x-meridian-route"] = orjson.dumps(
                    decision.describe(chosen.worker.id) | extra
                ).decode()
            try:
                result = await self.calls.attempt(
                    request, inference, request_id, decision, route_request, out,
                    timed_from=arrived if came_from is not None else None, trace=served.trace,
                )  # fmt: skip
            except Retry as why:
                log.warning("request %s: %s", request_id, why, extra={"request_id": request_id})
                self.escalations.attempted(model, ok=False)
                tried.add(why.worker_id)
                broken += why.broke
                if broken >= POISONED_AFTER:  # the request, not the workers: it goes no further
                    raise UpstreamFailed(
                        f"the request broke {broken} workers that were serving others; "
                        "it is not tried again"
                    ) from None
                since = self.clock()  # time lost to a failed worker is not the load's
                continue
            self.escalations.attempted(model, ok=True)
            return result
        failed = UpstreamFailed(f"{MAX_ATTEMPTS} workers failed the request", retry_after_s=1)
        done = await escalate("failure", failed.message) if failure else None
        if done is None:
            raise failed
        return done

    def _answer_headers(
        self, headers: dict[str, str], model: str, served: Served
    ) -> dict[str, str]:
        """The load header goes to peers (it is how they choose) and insiders, not tenants."""
        out = dict(headers)
        if served.insider:
            out[LOAD_HEADER] = self.load_of(model)
        return out
