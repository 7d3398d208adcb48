"""A tiered route's steps on the request's path (agents/gateway/tiers.py decides; this puts a
flight on its tier): the tier it starts on, its moves under load, and the cascade of a
cheaper tier's failing answer to the strongest. The gateway (service.py) takes them in."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from agents.config import RegionConfig
from agents.gateway.arrival import placed
from agents.gateway.errors import GatewayError
from agents.gateway.flight import OPERATOR, Flight
from agents.gateway.relay import Usage
from agents.gateway.tiers import TIER_HEADER, Tiers, as_stream, without_logprobs
from agents.router.plan import MoveTier, Placement, Progress, Tiering
from agents.router.router import Router

log = logging.getLogger(__name__)


Serve = Callable[[Flight], Awaitable[tuple[web.StreamResponse, Usage] | GatewayError]]


class TieredPath:
    """The gateway's steps for requests to tiered routes. `config`: the region's config in
    force (or the refusal of a gateway that has none); `serve`: the gateway's serve loop,
    which the cascade takes the request through again."""

    def __init__(
        self,
        router: Router,
        tiers: Tiers,
        clock: Callable[[], float],
        config: Callable[[], RegionConfig],
        serve: Serve,
    ) -> None:
        self.router, self.tiers, self.clock = router, tiers, clock
        self.config_or_refuse, self.serve = config, serve

    async def tier(self, flight: Flight) -> None:
        """A tiered route's request: the tier it starts on (agents/gateway/tiers.py)."""
        inference, config = flight.inference, self.config_or_refuse()
        route = inference.tiered
        assert route is not None
        choice = await self.tiers.choose(
            route, flight.tenant, flight.tenant is OPERATOR, inference,
            flight.placement.request.prompt_tokens, config.models, flight.caller.scope,
        )  # fmt: skip
        flight.tier = choice
        choice.streamed = inference.stream
        above = [i for i in choice.able if i > choice.index]
        below = [i for i in reversed(choice.able) if i < choice.index]
        for index in [choice.index, *above, *below]:  # the first whose context it fits
            placement = self.on_tier(flight, index)
            if not isinstance(placement, GatewayError):
                self.put_on_tier(flight, placement)
                return
            too_long = placement
        raise too_long

    def on_tier(self, flight: Flight, index: int) -> Placement | GatewayError:
        """Where the tiered request goes on tier `index`, or why it cannot (its context)."""
        choice, config = flight.tier, self.config_or_refuse()
        assert choice is not None
        model = config.models[choice.route.tiers[index]]
        return placed(self.router, config, model, flight.inference, flight.caller, tier=index)

    def put_on_tier(self, flight: Flight, placement: Placement) -> None:
        """Put the tiered request on its placement's tier: its model, route, fallback rule and
        body (re-encoded with the tier's model name)."""
        choice, inference, index = flight.tier, flight.inference, placement.tier
        assert choice is not None
        assert choice.doc is not None
        assert index is not None
        choice.index = index
        inference.model = placement.model
        changes: dict[str, object] = {"model": placement.model}
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
        flight.placement = placement
        flight.headers[TIER_HEADER] = choice.header()

    def tiering(self, flight: Flight) -> Tiering | None:
        """A tiered request's tiers to try under load, before its first attempt: each one's
        placement worked out only when the plan asks for it."""
        choice = flight.tier
        if choice is None or choice.cascaded is not None or not choice.route.capacity_moves:
            return None
        order = choice.order()
        if len(order) < 2:
            return None
        current, known = flight.placement, {}

        def placement(index: int) -> Placement | None:
            if index == current.tier:
                return current
            if index not in known:
                found = self.on_tier(flight, index)
                known[index] = None if isinstance(found, GatewayError) else found
            return known[index]

        return Tiering(choice.index, tuple(order), placement)

    def move(self, flight: Flight, plan: MoveTier) -> None:
        """The plan moved the request to another tier under load."""
        choice = flight.tier
        assert choice is not None
        self.tiers.moved(choice, plan.tier, "capacity", plan.why)
        self.put_on_tier(flight, plan.placement)

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
        attempts = flight.progress.attempts
        made_by = attempts[-1].by if attempts else ""
        self.tiers.books.cascades[choice.route.name, signal] += 1
        inference.extra = b""
        kept = as_stream(response, inference, choice.wants_usage) if choice.streamed else response
        top = self.on_tier(flight, choice.top)
        if isinstance(top, GatewayError):
            self.tiers.settled(choice)
            return kept, usage  # the strongest cannot take it: the answer stands
        self.tiers.moved(choice, choice.top, "cascade", f"{came}: {signal}")
        choice.cascaded = signal
        self.put_on_tier(flight, top)
        flight.answer, flight.progress = None, Progress(since=self.clock())
        answered = await self.serve(flight)
        if isinstance(answered, GatewayError):
            log.warning("request %s: the cascade to %s failed: %s", flight.id, choice.model,
                        answered.message, extra={"request_id": flight.id})  # fmt: skip
            return kept, usage  # the cheaper tier's answer stands
        if answered[0].status < 400:
            self.tiers.settled(choice)
        # the cheaper tier's answer was made too: the usage ledger records both
        flight.spent.append((came, usage.prompt_tokens or 0, usage.cached_tokens or 0,
                             usage.completion_tokens or 0, made_by))  # fmt: skip
        return answered
