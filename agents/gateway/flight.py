"""One request on the gateway's path, from arrival to settlement: what was asked and by whom,
where it is going (the router's `Placement`, replaced whole when its tier changes), how it has
fared (the router's `Progress`: its SLO clock, the attempts made), what streamed to the
client, and its receipt.

The path's steps (agents/gateway/service.py) each take the flight: authenticate, parse, admit,
plan, call or forward, relay, settle. What a step learns it writes here, so that the next
one (a retry, a migration, the receipt) has it without a long list of parameters.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from meridian_pb.fleet.v1.classes import ServiceClass

from agents.config import Tenant
from agents.gateway.gather import Gather
from agents.gateway.migration import Continuation, Transcript
from agents.gateway.relay import Usage
from agents.gateway.requests import Inference
from agents.gateway.tiers import TierChoice
from agents.gateway.upstream import Answer
from agents.metrics import Settled
from agents.router.plan import Ask, Placement, Progress

# the operator's token's: its requests may name any class
OPERATOR = Tenant("operator", "operator", None, None, None, class_ceiling=ServiceClass.INTERACTIVE)
ESCALATION = "escalation"  # the policy of a peer region's answer


@dataclass(eq=False, slots=True)
class Caller:
    """Who asks: the tenant, and what the request's way here says of it."""

    tenant: Tenant
    scope: str  # what its private memory is keyed by: its API key (a hash of it)
    came_from: str | None = None  # the peer region that escalated it here
    debug: bool = False  # the route receipt goes back in x-meridian-route
    waited_s: float = 0.0  # what the client waited before it came here (a peer's word)
    insider: bool = False  # a peer region, the operator or a tenant marked to see routes
    # the class a peer region's request arrived with (its word); then the class it is served at
    service_class: ServiceClass | None = None
    key: str = ""  # its API key's public prefix (the usage ledger's)
    asked_as: str = ""  # a peer's request: the id its client gave there (the usage ledger's)
    # a part of a peer's request that the peer records whole (the assertion's word: the tokens
    # its client had, of a stream carried on; 0, a tier's answer)
    carried: int | None = None


@dataclass(eq=False, slots=True)
class Stream:
    """The answer's stream to the client, once its head went out: it is one stream, whatever
    workers it comes from."""

    response: web.StreamResponse
    transcript: Transcript
    continuation: Continuation | None = None  # how the attempt under way carries it on
    cut: tuple[str, str] | None = None  # where it broke off and why, until carried on
    migrations: list[str] = field(default_factory=list)  # "from → to (why)"
    began: tuple[str, int] | None = None  # carried on: who began it, the tokens it made

    def carried_to(self, by: str) -> str | None:
        """Note that `by` carries the answer on; what to say of it (None if not cut)."""
        if self.cut is None:
            return None
        (came, why), self.cut = self.cut, None
        note = f"{came} → {by} ({why})"
        self.migrations.append(note)
        return note


@dataclass(eq=False, slots=True)
class Flight:
    http: web.Request
    id: str
    headers: dict[str, str]  # what every answer's head carries
    arrived: float  # when it came here (the gateway's monotonic clock)
    body: bytes  # as the client sent it
    caller: Caller
    inference: Inference
    ask: Ask  # what arrived, as the router reads it
    placement: Placement  # where it is going: replaced whole when its tier changes
    progress: Progress  # how it has fared: the SLO clock, the attempts
    stream: Stream | None = None
    gather: Gather | None = None  # a whole answer gathered from a stream, so far
    upstream: Answer | None = None  # the answer being relayed to the client
    answer: tuple[web.StreamResponse, Usage] | None = None  # what the client got
    tier: TierChoice | None = None  # a tiered route's request: its tier, and why
    rid: str = ""  # the engine's id for it: the gateway's own, never only what a client chose
    going: str = ""  # the engine's id for the go under way (see `engine_rid`)
    span: Any = None  # its trace span, when tracing is on
    trace: bytes = b""  # the span's context as header lines, for the engine (a kept trace)
    client_stalled: bool = False  # its client stopped reading: the stream was cut
    # answers made for it that its client did not get (a cheaper tier's, before a cascade):
    # (model, prompt, cached, completion tokens, worker), for the usage ledger
    spent: list[tuple[str, int, int, int, str]] = field(default_factory=list)
    kept: bool = False  # recorded here whole, a peer told that its part is ours to record
    fault: BaseException | None = None  # a fault of ours that ended its stream
    hold: Any = None  # what it may cost, held in its tenant's budgets (agents/gateway/budgets.py)

    def __post_init__(self) -> None:
        # a client's X-Request-ID is its to choose, and another tenant may choose the same:
        # the engine's rid (which /abort_request names) gets a part no client chooses; a
        # peer region's (signed) request keeps the rid it made, so that a stream carried on
        # there keeps its one id
        if not self.rid:
            came = self.caller.came_from is not None
            # within the 128 characters an X-Request-ID may have, for a peer's sake
            self.rid = self.id if came else f"{self.id[:115]}.{os.urandom(6).hex()}"

    def engine_rid(self) -> str:
        """The rid of the go under way at an engine. Each go has its own (the first's is
        `rid`), so that it never meets the go before it on an engine that has not yet dropped
        that one (an abort is sent, not awaited), nor is stopped by that one's abort; but a
        stream the client has seen part of is carried on under the id it saw."""
        if not (self.progress.continuing and self.going):
            goes = len(self.progress.attempts)
            self.going = self.rid if goes <= 1 else f"{self.rid}.{goes}"
        return self.going

    @property
    def tenant(self) -> Tenant:
        return self.caller.tenant

    @property
    def model(self) -> str:
        return self.placement.model


@dataclass(eq=False, slots=True)
class Trail:
    """What the request's path has made of it so far, whatever step it ends at: who asks
    (once authenticated), the flight (once parsed), its span."""

    span: Any = None
    trace: bytes = b""
    caller: Caller | None = None
    flight: Flight | None = None

    def settled(self, model: str | None, first_at: float | None) -> Settled:
        """What it came to, derived once at its end. `model`: the one its refusal names,
        when it was refused before a flight was made of it."""
        caller, flight = self.caller, self.flight
        tenant = caller.tenant.name if caller is not None else ""
        came_from = (caller.came_from or "") if caller is not None else ""
        served = caller.service_class if caller is not None else None
        label = served.label if served is not None else ""
        key = caller.key if caller is not None else ""
        asked_as = caller.asked_as if caller is not None else ""
        carried = caller.carried if caller is not None else None
        if flight is None:
            return Settled(model or "", tenant, first_at=first_at, came_from=came_from,
                           service_class=label, key=key, asked_as=asked_as,
                           carried=carried)  # fmt: skip
        usage = flight.answer[1] if flight.answer is not None else Usage()
        # the goes that were noted (every local call, and a peer's that answered): the last,
        # and the last local one
        last = local = None
        for attempt in reversed(flight.progress.attempts):
            if not attempt.policy:
                continue
            last = last or attempt
            if attempt.policy != ESCALATION:
                local = attempt
                break
        stream, admitted = flight.stream, flight.progress.admitted_at
        estimated = False
        if usage.completion_tokens is None and stream is not None:  # cut, or its client gone
            prompt = local.routed_prompt if local is not None else 0
            usage, estimated = Usage(prompt, stream.transcript.made(), 0), True
        return Settled(
            flight.model, tenant,
            last.by if last is not None else "",
            first_at, usage.completion_tokens, usage.prompt_tokens, usage.cached_tokens,
            local.routed_prompt if local is not None else 0,
            local.routed_cached if local is not None else 0,
            last.attributes if last is not None else None,
            last.policy if last is not None else "",
            last.reason if last is not None else "",
            came_from,
            "; ".join(stream.migrations) if stream is not None else "",
            flight.progress.crowded,
            local.load if local is not None else 0.0,
            label,
            None if admitted is None else max(0.0, admitted - flight.arrived),
            key,
            flight.tier.route.name if flight.tier is not None else "",
            estimated,
            tuple(flight.spent),
            asked_as,
            flight.hold,
            carried,
            stream.began if stream is not None else None,
            flight.kept,
        )  # fmt: skip
