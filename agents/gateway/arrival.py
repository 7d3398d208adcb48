"""A request's first steps on the gateway's path, before anything is taken for it: who asks
(authenticate) and what is asked, checked whole (parse). Only reads."""

from __future__ import annotations

from aiohttp import web
from meridian_pb.fleet.v1.classes import HEADER, TIER_HEADER, TIER_OF, ServiceClass, clamp

from agents.config import FallbackChain, ModelConfig, RegionConfig
from agents.engines.contract import engine_priority
from agents.gateway import assertion, auth
from agents.gateway.errors import GatewayError, UpstreamFailed, refusal_error
from agents.gateway.flight import OPERATOR, Caller, Flight
from agents.gateway.requests import Inference, asked_class, cache_salt, context_error, parse
from agents.router.escalation import Escalations
from agents.router.plan import Ask, Placement, Progress
from agents.router.router import Router

# what the engine is told of a request's class: SGLang's `priority`, put before the client's
# fields (a client's own `priority` is taken out of its body on arrival)
PRIORITY_FIELD = {c: b'"priority":%d,' % engine_priority(c) for c in ServiceClass}


class Arrival:
    """The gateway's steps that read a request."""

    def __init__(
        self,
        router: Router,
        assertions: assertion.Seen,
        escalations: Escalations,
        operator_token: str | None,
    ) -> None:
        self.router = router
        self.assertions = assertions  # the nonces of the escalations accepted here
        self.escalations = escalations
        self.operator_token = operator_token

    def authenticate(
        self, request: web.Request, config: RegionConfig, body: bytes, rid: str
    ) -> Caller:
        """Who asks: a peer region's signed word for its tenant, the operator, or a tenant's
        key."""
        signed = request.headers.get(assertion.HEADER)
        if signed is not None:  # escalated here by a peer region: its word for who asks
            seen = self.assertions
            claim = assertion.verify(signed, config, body=body, request_id=rid, seen=seen)
            self.escalations.received(claim.origin, claim.reason)
            scope = f"{claim.origin}/{claim.tenant.name}"  # the peer's word: its tenant
            return Caller(claim.tenant, scope, claim.origin, claim.debug, claim.waited_s, True,
                          claim.service_class, key=claim.key,
                          asked_as=claim.client_request_id,
                          carried=claim.carried)  # fmt: skip
        tenant, insider, scope = auth.caller(request.headers.get("Authorization"), config,
                                             self.operator_token)  # fmt: skip
        debug = insider and request.headers.get("x-meridian-debug") == "1"
        key = config.keys.get(scope)
        return Caller(tenant, scope, debug=debug, insider=insider,
                      key=key.prefix if key is not None else "")  # fmt: skip

    def parse(
        self,
        request: web.Request,
        config: RegionConfig,
        body: bytes,
        caller: Caller,
        request_id: str,
        headers: dict[str, str],
        arrived: float,
    ) -> Flight:
        """What is asked, checked whole (its parameters, and its prompt and answer against the
        model's context), and where it may go."""
        tenant = caller.tenant
        inference, model = parse(request.path, body, config, tenant.name)
        adapter = inference.adapter
        # an adapter's prefixes are cached apart: its KV is its own (SGLang keys its cache
        # by adapter too)
        salt = (
            inference.client_salt if adapter is None else f"{adapter.name}\0{inference.client_salt}"
        )
        inference.salt = cache_salt(tenant.name, salt)
        asked = (
            asked_class(request.headers.get(HEADER), inference)
            if caller.came_from is None
            else caller.service_class  # the class it arrived with, clamped here too
        )
        served = caller.service_class = clamp(asked, tenant.default_class, tenant.class_ceiling)
        headers[HEADER], headers[TIER_HEADER] = served.label, TIER_OF[served]
        inference.extra = PRIORITY_FIELD[served]
        route = config.routes.get(model.name)
        # a whole answer of a class that gives way is gathered from a stream, so that it
        # keeps its work when it does (agents/gateway/gather.py)
        inference.gathered = (
            inference.plain and inference.tiered is None and route is not None
            and route.classes.requeues(served)
        )  # fmt: skip
        ask = Ask(request_id, tenant.name, caller.came_from, tenant is OPERATOR, served)
        fits = model  # a tiered request: what its tiers take together (its tier is chosen next)
        if inference.tiered is not None:
            model = config.models[inference.tiered.tiers[-1]]  # meanwhile, the strongest
        elif route is not None and route.classes.rule(served).max_wait_s is not None:
            # a class bounded by its own wait: refused before it costs a tokenizer's pass,
            # where its line could not take it within its bound
            chain = chain_of(config, model, caller, served)
            early = self.router.admission.on_arrival(ask, route, chain)
            if early is not None:
                refusal = refusal_error(early)
                refusal.model = model.name
                raise refusal
        placement = placed(self.router, config, model, inference, caller, fits)
        if isinstance(placement, GatewayError):
            placement.model = model.name  # a refusal of the model's: counted as its
            raise placement
        progress = Progress(since=arrived - caller.waited_s)  # the SLO is the client's, end to end
        return Flight(
            request, request_id, headers, arrived, body, caller, inference, ask,
            placement, progress,
        )  # fmt: skip


def placed(
    router: Router,
    config: RegionConfig,
    model: ModelConfig,
    inference: Inference,
    caller: Caller,
    fits: ModelConfig | None = None,
    tier: int | None = None,
) -> Placement | GatewayError:
    """The request as the router takes it for `model`, the model's route here and the
    tenant's fallback rule for it (a peer's request goes no further: none); or why it cannot
    go there: it does not fit the context of `fits` (default: the model), or the region has
    no route for it."""
    served = ServiceClass.STANDARD if caller.service_class is None else caller.service_class
    route_request = router.request(model.name, inference.key, inference.tokens, inference.max_new,
                                   inference.salt or None,
                                   whole=not (inference.stream or inference.gathered),
                                   service_class=served)  # fmt: skip
    if inference.adapter is not None:
        route_request.adapter = inference.adapter.name
        route_request.cold_load_s = router.cold_load_s()
    too_long = context_error(fits or model, route_request.prompt_tokens, inference.max_new)
    if too_long is not None:
        return too_long
    route = config.routes.get(model.name)
    if route is None:
        return UpstreamFailed(f"region {config.region} has no route for {model.name}")
    return Placement(model.name, route, route_request, chain_of(config, model, caller, served),
                     tier)  # fmt: skip


def chain_of(
    config: RegionConfig, model: ModelConfig, caller: Caller, served: ServiceClass
) -> FallbackChain | None:
    """The tenant's fallback rule for the model and class (a peer's request: none)."""
    if caller.came_from is not None:
        return None
    return config.chain(model.name, caller.tenant.tier, served)
