"""One request on the gateway's path, from arrival to settlement: what was asked and by whom,
its SLO clock, the attempts made with what each streamed to the client, and its receipt.

The path's steps (agents/gateway/service.py) each take the flight: authenticate, parse, admit,
choose, call or forward, relay, settle. What a step learns it writes here, so that the next
one (a retry, a migration, the receipt) has it without a long list of parameters.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from aiohttp import web

from agents.control.compile import FallbackChain, ModelConfig, RouteConfig, Tenant
from agents.gateway.migration import Continuation, Transcript
from agents.gateway.relay import Usage
from agents.gateway.requests import Inference
from agents.gateway.tiers import TierChoice
from agents.gateway.upstream import Answer
from agents.metrics import Served
from agents.router.policies import RouteRequest

MAX_ATTEMPTS = 3  # workers tried before the client has seen a byte
MAX_MIGRATIONS = 2  # a started stream carried on elsewhere, at most this often
OPERATOR = Tenant("operator", "operator", None, None, None)  # the operator's token's


@dataclass(eq=False, slots=True)
class Caller:
    """Who asks: the tenant, and what the request's way here says of it."""

    tenant: Tenant
    scope: str  # what its private memory is keyed by: its API key (a hash of it)
    came_from: str | None = None  # the peer region that escalated it here
    debug: bool = False  # the route receipt goes back in x-meridian-route
    waited_s: float = 0.0  # what the client waited before it came here (a peer's word)


@dataclass(eq=False, slots=True)
class Attempt:
    """One worker's (or peer's) go at the request, and how it ended."""

    by: str  # the worker id, or peer:<region>
    ended: str = ""  # why it failed ("" while it runs, or when it answered)


@dataclass(eq=False, slots=True)
class Stream:
    """The answer's stream to the client, once its head went out: it is one stream, whatever
    workers it comes from."""

    response: web.StreamResponse
    transcript: Transcript
    continuation: Continuation | None = None  # how the attempt under way carries it on
    cuts: int = 0  # times it broke off
    cut: tuple[str, str] | None = None  # where it broke off and why, until carried on
    migrations: list[str] = field(default_factory=list)  # "from → to (why)"

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
    served: Served  # the receipt: what metrics, the route receipts and the span are told
    arrived: float  # when it came here (the gateway's monotonic clock)
    since: float  # the SLO clock's start: earlier for a peer's request, later after a retry
    body: bytes  # as the client sent it
    caller: Caller
    inference: Inference
    model: ModelConfig
    route_request: RouteRequest
    route: RouteConfig
    chain: FallbackChain | None  # the tenant's fallback rule for the model, if any
    attempts: list[Attempt] = field(default_factory=list)
    tried: set[str] = field(default_factory=set)  # workers not to try again
    failures: int = 0  # workers that failed it before the client saw a byte of theirs
    broken: int = 0  # workers that broke off with it in hand, while serving others
    stream: Stream | None = None
    upstream: Answer | None = None  # the answer being relayed to the client
    answer: tuple[web.StreamResponse, Usage] | None = None  # what the client got
    tier: TierChoice | None = None  # a tiered route's request: its tier, and why
    rid: str = ""  # the engine's id for it: the gateway's own, never only what a client chose

    def __post_init__(self) -> None:
        # a client's X-Request-ID is its to choose, and another tenant may choose the same:
        # the engine's rid (which /abort_request names) gets a part no client chooses; a
        # peer region's (signed) request keeps the rid it made, so that a stream carried on
        # there keeps its one id
        if not self.rid:
            came = self.caller.came_from is not None
            # within the 128 characters an X-Request-ID may have, for a peer's sake
            self.rid = self.id if came else f"{self.id[:115]}.{os.urandom(6).hex()}"

    @property
    def tenant(self) -> Tenant:
        return self.caller.tenant

    @property
    def continuing(self) -> bool:
        """The client has seen part of the answer: what comes next continues it."""
        return self.stream is not None

    def attempt(self, by: str) -> Attempt:
        attempt = Attempt(by)
        self.attempts.append(attempt)
        return attempt
