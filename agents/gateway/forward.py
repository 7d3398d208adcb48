"""Forwarding an escalated request to a peer region's gateway, one hop.

The client's body goes as it came, with a signed assertion of the tenant's identity (never a
key), of its one hop and of the client's wait so far, the request id and the W3C trace
context, so that the peer never forwards it again and does not count it against the
tenant's quota a second time. A peer that
fails, refuses (429, 503) or cannot be reached before the client has seen a byte makes way
for the next candidate; a stream that breaks after its first byte ends with an SSE error
event. Each answer's head tells the peer's view its load and the round trip.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from agents.config import Peer, RegionConfig
from agents.gateway import assertion
from agents.gateway.carry import Carrier
from agents.gateway.flight import ESCALATION, Flight
from agents.gateway.migration import Transcript
from agents.gateway.relay import (
    Answered,
    Broken,
    Cut,
    Outcome,
    Retry,
    Usage,
    body_usage,
    relayed_headers,
    upstream_headers,
)
from agents.gateway.streams import relay_stream
from agents.gateway.upstream import Answer, Upstream
from agents.router.escalation import LOAD_HEADER, Escalations, PeerChoice, tries_another

log = logging.getLogger(__name__)
TRACE_HEADERS = ("traceparent", "tracestate")
HEAD_TIMEOUT_S = 60.0  # the longest a peer may take to answer's head (a stream's first event)
DROPPED = {LOAD_HEADER, "server-timing"}  # the peer's own, not the client's


@dataclass
class Escalated:
    """How an escalation went: the answer, or the peers tried and why each one failed."""

    reason: str
    rule: str
    candidates: list[PeerChoice]
    peer: str | None = None
    response: web.StreamResponse | None = None
    usage: Usage | None = None
    refused: dict[str, str] = field(default_factory=dict)
    ended: Cut | Broken | None = None  # a peer's stream that broke off after it began

    def describe(self) -> dict[str, object]:
        return {
            "reason": self.reason,
            "rule": self.rule,
            "peer": self.peer,
            "candidates": [
                {"region": c.peer.region, "predicted_ttft_ms": round(c.predicted_s * 1000, 1)}
                for c in self.candidates
            ],
            **({"refused": self.refused} if self.refused else {}),
        }


class Forwarder:
    def __init__(
        self,
        escalations: Escalations,
        upstream: Upstream,
        carrier: Carrier,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.escalations = escalations
        self.upstream = upstream
        self.carrier = carrier
        self.clock = clock

    async def escalate(
        self,
        flight: Flight,
        config: RegionConfig,
        reason: str,
        why: str,
        headers: dict[str, str],
        trace: bytes,
    ) -> Outcome | None:
        """A peer's answer (its receipt then says where it went and why), or its stream that
        broke off after it began; None when no peer took it."""
        chain = flight.placement.chain
        if chain is None:
            return None
        outcome = await self.forward(flight, config, reason, why, headers, trace)
        log.debug("request %s escalated (%s: %s) to %s", flight.id, reason, why,
                  outcome.peer or f"no peer: {outcome.refused or 'none allowed'}")  # fmt: skip
        if outcome.ended is not None:
            return outcome.ended
        if outcome.response is None:
            return None
        self.escalations.books.escalated[flight.model] += 1
        attempt = flight.progress.attempts[-1]  # the peer's that answered: noted
        attempt.policy, attempt.reason = ESCALATION, f"{reason}: {why}"
        attempt.attributes = {"meridian.escalated": True, "meridian.escalation.reason": reason,
                              "meridian.escalation.why": why, "meridian.peer": outcome.peer,
                              "meridian.escalation.rule": chain.rule}  # fmt: skip
        return Answered(outcome.response, outcome.usage or Usage())

    async def forward(
        self,
        flight: Flight,
        config: RegionConfig,
        reason: str,
        why: str,
        headers: dict[str, str],
        trace: bytes = b"",
    ) -> Escalated:
        """The request (or, for a stream cut mid-answer, its continuation) to the peers its
        fallback rule names, best first. `trace`: this gateway's span context; without it,
        the client's passes on."""
        chain, model, tenant = flight.placement.chain, flight.model, flight.tenant
        assert chain is not None  # the plan sends only what a rule covers (agents/router/plan.py)
        candidates = self.escalations.candidates(chain, model, tenant.jurisdictions)
        outcome = Escalated(reason, chain.rule, candidates)
        if config.signer is None:
            return outcome
        stream = flight.stream
        carried = stream.continuation if stream is not None else None
        body = carried.body if carried is not None else flight.body
        # a part of the request this region records whole: a stream carried on, or a tier's
        # answer it may cascade (the peer records its part unbilled: agents/ledger/record.py)
        tier = flight.tier
        cascades = tier is not None and tier.route.cascade is not None
        part = carried.shift if carried is not None else 0 if cascades else None
        flight.kept = flight.kept or part is not None
        trace = trace or _client_trace(flight.http)
        for n, choice in enumerate(candidates):
            peer = choice.peer
            assert peer.gateway_url is not None  # candidates have one
            if n and not self.escalations.still_usable(peer.region, model):
                outcome.refused[peer.region] = "not now: its breaker"
                continue
            waited_ms = (self.clock() - flight.arrived) * 1000
            signed = assertion.sign(
                config.signer, origin=config.region, audience=peer.region, tenant=tenant,
                request_id=flight.rid, reason=reason, body=body, debug=flight.caller.debug,
                waited_ms=waited_ms, service_class=flight.ask.service_class,
                api_key=flight.caller.key, client_request_id=flight.id,
                carried=part,
            )  # fmt: skip
            sent = (
                upstream_headers(flight.rid) + trace + f"{assertion.HEADER}: {signed}\r\n".encode()
            )
            with self.escalations.sending(peer.region, reason):
                refused = await self._try(flight, outcome, peer, body, sent, why, headers)
            if refused is None:
                return outcome
            outcome.refused[peer.region] = refused
        return outcome

    async def _try(
        self,
        flight: Flight,
        outcome: Escalated,
        peer: Peer,
        body: bytes,
        sent: bytes,
        why: str,
        headers: dict[str, str],
    ) -> str | None:
        """One peer's try: None when it answered (`outcome` holds the answer), else why not."""
        started, region, model = self.clock(), peer.region, flight.model
        assert peer.gateway_url is not None
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                answer = await self.upstream.post(peer.gateway_url, flight.http.path, body, sent)
        except (OSError, TimeoutError) as error:
            self.escalations.unreachable(region)
            log.warning("peer %s unreachable: %s", region, error)
            return f"unreachable: {error}"
        with answer:
            retry_after = answer.header(b"retry-after")
            self.escalations.answered(
                region, model, status=answer.status,
                elapsed_s=self.clock() - started,
                load=_text(answer.header(LOAD_HEADER.encode())),
                server_s=server_seconds(answer.header(b"server-timing")),
                retry_after_s=float(retry_after) if retry_after and retry_after.isdigit() else None,
            )  # fmt: skip
            if tries_another(answer.status):
                return f"answered {answer.status}"
            if answer.status == 404 and flight.inference.adapter is not None:
                # its snapshot does not hold the adapter yet (a rollout under way): the next
                return "answered 404: it does not serve the adapter"
            out = {k: v for k, v in relayed_headers(answer.headers).items()
                   if k.lower() not in DROPPED}  # fmt: skip
            out.update({k: v for k, v in headers.items() if k.lower() != "x-meridian-region"})
            outcome.peer = region
            self.carrier.carried(flight, flight.progress.attempt(f"peer:{region}").by)
            if flight.caller.debug:  # why it escalated, with the peer's own route if it gave one
                described = outcome.describe() | {"why": why}
                if "x-meridian-route" in out:
                    described["peer_route"] = _loads(out["x-meridian-route"])
                out["x-meridian-route"] = orjson.dumps({"escalated": described}).decode()
            try:
                relayed = await self._relay(flight, answer, region, out)
            except OSError as error:
                self.escalations.unreachable(region)
                outcome.peer = None
                return f"broke: {error}"
        match relayed:
            case Answered(response, usage):
                outcome.response, outcome.usage = response, usage
            case Retry():  # the peer failed it before the client saw a byte: the next one
                outcome.peer = None
                return str(relayed)
            case Cut() | Broken():  # after: carried on as any cut stream; or a fault of ours
                outcome.ended = relayed
        return None

    async def _relay(
        self, flight: Flight, answer: Answer, region: str, headers: dict[str, str]
    ) -> Outcome:
        if flight.inference.stream and answer.status == 200:
            return await relay_stream(flight, answer, _PeerTrack(self.escalations, region), headers)
        data = await answer.read()
        usage = body_usage(data, flight.inference.native) if answer.status == 200 else Usage()
        return Answered(web.Response(body=data, status=answer.status, headers=headers), usage)


@dataclass
class _PeerTrack:
    escalations: Escalations
    name: str

    def taken(self) -> Outcome | None:
        return None  # a peer's answer is the peer's to preempt

    def first_byte(self) -> None:
        pass

    def progressed(self, events: int) -> None:
        pass

    def failed(self, broke: bool) -> bool:
        self.escalations.unreachable(self.name)
        return False

    def finished(self, usage: Usage, transcript: Transcript) -> None:
        pass  # a peer's workers are its own guard's to judge


def server_seconds(header: bytes | None) -> float | None:
    """The peer gateway's own time from `Server-Timing: gw;dur=<ms>`."""
    if not header:
        return None
    for part in header.split(b";"):
        name, _, value = part.strip().partition(b"=")
        if name == b"dur":
            try:
                return float(value) / 1000
            except ValueError:
                return None
    return None


def _client_trace(request: web.Request) -> bytes:
    """The client's W3C trace context, passed on as it came when it is visible ASCII (a
    header the server parsed holds no CR or LF); dropped otherwise."""
    lines = []
    for name in TRACE_HEADERS:
        value = request.headers.get(name)
        if value is not None and value.isascii() and value.isprintable():
            lines.append(f"{name}: {value}\r\n".encode())
    return b"".join(lines)


def _loads(text: str) -> object:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _text(value: bytes | None) -> str | None:
    return value.decode("latin-1") if value is not None else None
