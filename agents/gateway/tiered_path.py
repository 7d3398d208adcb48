"""A tiered route's steps on the request's path (agents/gateway/tiers.py decides; this puts a
flight on its tier): the tier it starts on, its moves under load, and the cascade of a
cheaper tier's failing answer to the strongest. The gateway (service.py) takes them in."""

from __future__ import annotations

import logging
from collections.abc import Callable

import orjson
from aiohttp import web

from agents.control.compile import RegionConfig
from agents.gateway.admission import Admission, Escalate, EscalateOver
from agents.gateway.arrival import routed
from agents.gateway.errors import (
    ContextTooLong,
    GatewayError,
    NoHealthyWorker,
    QueueFull,
    TenantShare,
)
from agents.gateway.flight import OPERATOR, Flight
from agents.gateway.relay import Usage
from agents.gateway.tiers import TIER_HEADER, Tiers, as_stream, without_logprobs
from agents.router.decision import Decision
from agents.router.router import Router

log = logging.getLogger(__name__)


class TieredPath:
    """The gateway's steps for requests to tiered routes."""

    router: Router
    admission: Admission
    tiers: Tiers
    clock: Callable[[], float]

    def config_or_refuse(self) -> RegionConfig:
        raise NotImplementedError

    async def serve(self, flight: Flight) -> tuple[web.StreamResponse, Usage]:
        raise NotImplementedError

    async def tier(self, flight: Flight) -> None:
        """A tiered route's request: the tier it starts on (agents/gateway/tiers.py)."""
        inference, config = flight.inference, self.config_or_refuse()
        route = inference.tiered
        assert route is not None
        choice = await self.tiers.choose(
            route, flight.tenant, flight.tenant is OPERATOR, inference,
            flight.route_request.prompt_tokens, config.models, flight.caller.scope,
        )  # fmt: skip
        flight.tier = choice
        choice.streamed = inference.stream
        above = [i for i in choice.able if i > choice.index]
        below = [i for i in reversed(choice.able) if i < choice.index]
        for index in [choice.index, *above, *below]:  # the first whose context it fits
            try:
                self.retier(flight, index)
                return
            except ContextTooLong as error:
                too_long = error
        raise too_long

    def retier(self, flight: Flight, index: int) -> None:
        """Put the tiered request on tier `index`: its model, route, fallback rule and body
        (re-encoded with the tier's model name); raises for a tier it does not fit."""
        choice, config, inference = flight.tier, self.config_or_refuse(), flight.inference
        assert choice is not None
        assert choice.doc is not None
        model = config.models[choice.route.tiers[index]]
        route_request, route = routed(self.router, config, model, inference)
        choice.index = index
        inference.model = flight.served.model = model.name
        changes: dict[str, object] = {"model": model.name}
        cascade, cheaper = choice.route.cascade, index < choice.top and choice.cascaded is None
        # a stream the cascade may judge is asked whole of a cheaper tier, and streamed to the
        # client once judged; the strongest tier's streams as asked
        inference.stream = choice.streamed and not (cheaper and choice.buffers)
        if choice.streamed and not inference.stream:
            changes |= {"stream": False, "stream_options": None}
        inference.extra = b""
        if (
            cheaper
            and cascade is not None
            and "low_logprob" in cascade.signals
            and not inference.stream
            and "logprobs" not in choice.doc
        ):  # a cheaper tier's answer is judged by its log-probabilities, not shown them
            logprobs = b"true" if inference.messages is not None else b"1"
            inference.extra = b'"logprobs":' + logprobs + b","
        inference.body = flight.body = orjson.dumps(choice.doc | changes)
        flight.model, flight.route_request, flight.route = model, route_request, route
        if flight.caller.came_from is None:
            flight.chain = config.chain(model.name, flight.tenant.tier)
        flight.headers[TIER_HEADER] = choice.header()

    async def by_capacity(self, flight: Flight) -> Decision | None:
        """A tiered request whose tier would break its SLO, moved to the next tier that would
        not (down to its floor, then up); None when every tier would (it then waits on its
        own tier, is refused or escalates, as any request)."""
        choice = flight.tier
        assert choice is not None
        start, order = choice.index, choice.order()
        if not choice.route.capacity_moves or len(order) < 2:
            return None
        full: list[str] = []
        for index in order:
            try:
                if index != choice.index:
                    self.retier(flight, index)
            except GatewayError:
                continue  # a tier it does not fit (its context): not one to move to
            route = flight.route
            over = EscalateOver(route.slo_ttft_s, None) if route.slo_ttft_s else None
            try:
                decision = await self.admission.place(
                    route, flight.route_request, flight.tried, flight.since, over,
                    flight.tenant.name,
                )  # fmt: skip
            except (Escalate, QueueFull, TenantShare, NoHealthyWorker) as why:
                full.append(f"{route.model}: {why}")
                continue
            if index != start:
                way = "down" if index < start else "up"
                reason = "; ".join(full)
                choice.index = start
                self.tiers.moved(choice, index, "capacity", f"moved {way}: {reason}")
                flight.headers[TIER_HEADER] = choice.header()
            return decision
        if choice.index != start:
            self.retier(flight, start)
        return None

    async def cascade(
        self, flight: Flight, response: web.StreamResponse, usage: Usage
    ) -> tuple[web.StreamResponse, Usage]:
        """A cheaper tier's whole answer that shows one of the route's failure signals is asked
        again of the strongest tier, once; the client sees one answer. Log-probabilities the
        gateway asked for, and the client did not, are taken out of the answer it keeps."""
        choice, inference = flight.tier, flight.inference
        assert choice is not None
        cascade = choice.route.cascade
        data = response.body if isinstance(response, web.Response) else None
        whole = isinstance(data, bytes) and response.status == 200
        if whole and inference.extra:
            assert isinstance(response, web.Response)
            assert isinstance(data, bytes)
            response.body = without_logprobs(data)
        if not whole or cascade is None or choice.index == choice.top or inference.stream:
            if response.status < 400:
                self.tiers.settled(choice)
            return response, usage
        assert isinstance(data, bytes)
        signal = self.tiers.signal(cascade, data, inference)
        if signal is None:
            self.tiers.settled(choice)
            if choice.streamed:  # judged whole: now streamed to the client
                return as_stream(response, inference, choice.wants_usage), usage
            return response, usage
        came = choice.model
        self.tiers.cascades[choice.route.name, signal] += 1
        inference.extra = b""
        kept = as_stream(response, inference, choice.wants_usage) if choice.streamed else response
        try:
            self.retier(flight, choice.top)
        except GatewayError:
            self.tiers.settled(choice)
            return kept, usage  # the strongest cannot take it: the answer stands
        self.tiers.moved(choice, choice.top, "cascade", f"{came}: {signal}")
        choice.cascaded = signal
        flight.headers[TIER_HEADER] = choice.header()
        flight.answer, flight.since = None, self.clock()
        flight.attempts.clear()
        flight.tried.clear()
        flight.failures = flight.broken = 0
        try:
            answered = await self.serve(flight)
        except GatewayError as error:
            log.warning("request %s: the cascade to %s failed: %s", flight.id, choice.model,
                        error.message, extra={"request_id": flight.id})  # fmt: skip
            return kept, usage  # the cheaper tier's answer stands
        if answered[0].status < 400:
            self.tiers.settled(choice)
        return answered
