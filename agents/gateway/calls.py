"""The gateway's calls to its region's engines: one attempt on the router's choice (a PD pair
when disaggregated), its bytes relayed, and what came back told to the router.

A worker that fails before the first byte reaches the client (refused, reset, 5xx, a stream
that ends before its first event) comes back as Retry, so the next worker is tried. A client that
goes away has its upstream request closed and aborted, so the engine stops working on it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Coroutine
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from meridian_pb.fleet.v1.classes import ServiceClass

from agents.adapters.files import AdapterUnavailable
from agents.adapters.keeper import AdapterKeeper
from agents.engines import contract
from agents.gateway import answers
from agents.gateway.errors import EngineRefused
from agents.gateway.flight import Flight
from agents.gateway.gather import Gather, gather_stream
from agents.gateway.migration import Transcript
from agents.gateway.relay import (
    Answered,
    Outcome,
    Refused,
    Retry,
    Usage,
    body_usage,
    engine_message,
    relayed_headers,
    server_timing,
    upstream_headers,
)
from agents.gateway.requests import Inference
from agents.gateway.slots import RESCUE_S, Slot
from agents.gateway.streams import relay_stream
from agents.gateway.upstream import Answer, Unreachable, Upstream
from agents.router.admission import Admission
from agents.router.classes import YIELDS, Victim
from agents.router.decision import Ticket
from agents.router.plan import Call, Continue, Pair
from agents.router.policies import Candidate, RouteRequest
from agents.router.router import Router

if TYPE_CHECKING:
    from agents.quality.runtime import Quality

log = logging.getLogger(__name__)
JSON = b"Content-Type: application/json\r\n"
PAIRED = (Pair, Continue)  # the calls that may name a prefill worker
PREFILL_SLACK_S = 2.0  # past its predicted first token, a request is no longer in prefill


class EngineCalls:
    def __init__(self, router: Router, admission: Admission, upstream: Upstream) -> None:
        self.router = router
        self.admission = admission
        self.upstream = upstream
        self._background: set[asyncio.Task[bool]] = set()
        self.quality: Quality | None = None  # reads every ended answer (agents/quality)
        self.adapters: AdapterKeeper | None = None  # loads an adapter where it is not held

    async def attempt(self, flight: Flight, plan: Call, headers: dict[str, str]) -> Outcome:
        """One worker's (or PD pair's) go at the request: its answer relayed, or Retry (it
        failed before the client saw a byte of it) or Cut (after)."""
        decision, wait_s = plan.decision, plan.wait_s
        chosen = decision.ranked[0]
        prefill = plan.prefill if isinstance(plan, PAIRED) else None
        worker, inference, rid = chosen.worker, flight.inference, flight.engine_rid()
        if decision.pd is not None:
            self.router.books.pd_choices[decision.pd] += 1
        stream = flight.stream
        given = stream.continuation.body if stream and stream.continuation else None
        gather = flight.gather
        if inference.gathered:  # asked as a stream, carried on from what came before
            gather = flight.gather = gather or Gather(inference)
            given = gather.next_body()
        request = flight.placement.request
        with self.dispatch(chosen, request, rid, bool(prefill), wait_s) as slot:
            ticket, slot.batch = slot.ticket, inference.batch
            served, classes = flight.ask.service_class, flight.placement.route.classes
            if served > ServiceClass.INTERACTIVE and not flight.progress.continuing:
                # it gives way up to YIELDS times; then it runs to its end
                requeue = classes.requeues(served) and flight.progress.yields < YIELDS
                if requeue or classes.preempt:  # a higher class may take its room
                    abort = partial(self.abort_later, worker.url, rid, inference.batch)
                    slot.victim = Victim(ticket, served, abort, requeue)
                    self.admission.enlist(ticket.model, slot.victim)
            sent_headers = upstream_headers(rid) + flight.trace
            if prefill is not None:
                slot.prefill = self._prefill(prefill, flight, sent_headers, given)
                body = inference.upstream_body(rid, slot.prefill.fields, given)
            else:
                body = inference.upstream_body(rid, body=given)
            slot.sent = True
            if inference.stream and classes.takes_room(served) and not flight.progress.continuing:
                slot.rescue_after(RESCUE_S + (wait_s or 0.0), served)
            upstream: Answer | None
            adapter = inference.adapter
            if adapter is not None and self.adapters is not None:
                try:  # a cold load, where the engine does not hold it: counted, timed
                    await self.adapters.ensure(chosen.entry, adapter)
                except AdapterUnavailable as error:
                    return slot.ended(Retry(worker.id, error.message))
            try:
                if slot.prefill is None:
                    upstream = await self.upstream.post(
                        worker.url, inference.path, body, sent_headers
                    )
                else:
                    upstream = await self._paired(
                        slot.prefill, worker.url, inference, body, sent_headers, ticket
                    )
            except OSError as error:  # UpstreamError among them
                broke = self._failed(ticket, self._early(ticket, error))
                return slot.ended(Retry(worker.id, f"{type(error).__name__}: {error}", broke))
            if upstream is None:  # the prefill failed first: the slot stops the decode call
                assert slot.prefill is not None
                return slot.ended(Retry(slot.prefill.worker_id, "the prefill worker failed"))
            if slot.preempted:  # aborted there: its room went to a higher class
                upstream.close()
                return slot.ended(slot.taken())
            with upstream:
                if upstream.status >= 500:  # the engine says it failed: a worker's failure
                    self._failed(ticket)
                    return slot.ended(Retry(worker.id, f"answered {upstream.status}"))
                since = flight.arrived if flight.caller.came_from is not None else None
                if gather is not None and upstream.status == 200:
                    track = _EngineTrack(self, slot, inference, flight.id, flight.tenant.name,
                                         shown=False)  # fmt: skip
                    outcome = await gather_stream(flight, gather, upstream, track, headers, since)
                    return slot.ended(outcome)
                if inference.stream and upstream.status == 200:
                    track = _EngineTrack(self, slot, inference, flight.id, flight.tenant.name)
                    return slot.ended(await relay_stream(flight, upstream, track, headers, since))
                try:
                    data = await upstream.read()
                except OSError as error:
                    broke = self._failed(ticket, self._early(ticket, error))
                    return slot.ended(Retry(worker.id, f"{type(error).__name__}: {error}", broke))
                if slot.preempted:
                    return slot.ended(slot.taken())
            usage = body_usage(data, inference.native) if upstream.status == 200 else Usage()
            self._finished(ticket, inference, usage)
            if self.quality is not None and upstream.status == 200:
                # read once the answer is on its way: the client does not wait for it
                asyncio.get_running_loop().call_soon(
                    self._observe, worker.id, flight.id, data, inference, flight.tenant.name
                )
        if 400 <= upstream.status < 500:
            if inference.adapter is not None and contract.NEVER_LOADED.encode() in data:
                # it restarted since it was seen holding the adapter: loaded there, or
                # elsewhere, by the next try
                entry = chosen.entry
                self.router.table.holds(worker.id, {
                    n: p for n, p in entry.adapters.items() if n != inference.adapter.name
                })  # fmt: skip
                return Retry(worker.id, "its adapter was not loaded there")
            return Refused(EngineRefused(upstream.status, engine_message(data)))
        out = relayed_headers(upstream.headers)
        out.update(headers)
        if since is not None:
            out["Server-Timing"] = server_timing(since)
        return Answered(web.Response(body=data, status=upstream.status, headers=out), usage)

    def dispatch(
        self,
        chosen: Candidate,
        request: RouteRequest,
        rid: str,
        prefilled: bool = False,
        wait_s: float | None = None,
    ) -> Slot:
        """The worker's in-flight slot for one request, held by `with`: what ends without the
        worker's answer or failure (a client that left, an exception) frees it and, when the
        request may have reached the engine, tells the engine to stop."""
        ticket = self.router.dispatched(chosen, request, prefilled, wait_s)
        return Slot(self, ticket, chosen.worker.url, rid)

    def _prefill(
        self, prefill: Candidate, flight: Flight, headers: bytes, given: bytes | None
    ) -> PrefillHalf:
        """PD: the same body to the prefill worker, with the bootstrap fields SGLang expects;
        its answer is read and dropped (the client gets the decode worker's)."""
        worker, inference, request_id = prefill.worker, flight.inference, flight.engine_rid()
        room = secrets.randbits(63)
        fields = (
            b'"bootstrap_host":' + orjson.dumps(worker.host)
            + b',"bootstrap_port":' + str(worker.bootstrap_port).encode()
            + b',"bootstrap_room":' + str(room).encode() + b","
        )  # fmt: skip
        body = inference.upstream_body(request_id, fields, given)
        route_request = flight.placement.request
        call = self._prefill_call(prefill, route_request, request_id, inference.path, body, headers)
        return PrefillHalf(worker.id, fields, self.in_background(call))

    async def _prefill_call(
        self,
        prefill: Candidate,
        route_request: RouteRequest,
        rid: str,
        path: str,
        body: bytes,
        headers: bytes,
    ) -> bool:
        with self.dispatch(prefill, route_request, rid) as slot:
            ticket, slot.sent = slot.ticket, True
            try:
                with await self.upstream.post(prefill.worker.url, path, body, headers) as answer:
                    await answer.read()
            except OSError:
                self._failed(ticket)
                return False
            if answer.status >= 500:
                self._failed(ticket)
                return False
            self.router.first_byte(ticket)
            self.router.finished(ticket, 0, None, None)
            return True

    async def _paired(
        self,
        pd: PrefillHalf,
        worker_url: str,
        inference: Inference,
        body: bytes,
        headers: bytes,
        ticket: Ticket,
    ) -> Answer | None:
        """The decode call, given up (None: retried on another pair) if the prefill fails
        before the decode worker has answered."""
        decode = asyncio.ensure_future(
            self.upstream.post(worker_url, inference.path, body, headers)
        )
        try:
            await asyncio.wait({decode, pd.task}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            _drop(decode)
            raise
        if not decode.done() and not pd.task.result():
            _drop(decode)  # the slot frees the decode worker and tells it to stop
            return None
        return await decode

    def _observe(
        self, worker: str, rid: str, data: bytes, inference: Inference, tenant: str
    ) -> None:
        if self.quality is not None:
            answer = answers.from_body(data, inference)
            self.quality.observe(worker, rid, answer, partial(answers.prompt_text, inference),
                                 inference.key, tenant)  # fmt: skip

    def _finished(self, ticket: Ticket, inference: Inference, usage: Usage) -> None:
        self.router.finished(
            ticket, len(inference.key), usage.prompt_tokens, usage.completion_tokens
        )
        self.admission.notify(ticket.model)

    def _early(self, ticket: Ticket, error: OSError) -> bool:
        """The engine broke off with the request in hand before its first token could have
        come (within its predicted wait and PREFILL_SLACK_S): the request may be what broke
        it. One that breaks later, mid-answer, was most likely killed or failed on its own."""
        if isinstance(error, Unreachable):  # it never reached the engine
            return False
        return self.router.clock() - ticket.sent_at <= ticket.predicted_s + PREFILL_SLACK_S

    def _failed(self, ticket: Ticket, broke: bool = False) -> bool:
        """The worker failed the request; whether it broke off with the request in hand
        while it had been serving others (the request may be what broke it)."""
        view = self.router.views.get(ticket.worker_id)
        serving = view is not None and view.breaker.failures == 0
        self.router.failed(ticket)
        self.admission.notify(ticket.model)
        return broke and serving

    def abort_later(self, worker_url: str, rid: str, batch: int = 1) -> None:
        """Tell the engine to stop the request: a batch's each prompt (SGLang names them
        `<rid>_<i>`)."""
        if rid:
            rids = [rid] if batch == 1 else [f"{rid}_{i}" for i in range(batch)]
            for one in rids:
                self.in_background(self._abort(worker_url, one))

    def in_background(self, call: Coroutine[Any, Any, bool]) -> asyncio.Task[bool]:
        task = asyncio.get_running_loop().create_task(call)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _abort(self, worker_url: str, rid: str) -> bool:
        body = orjson.dumps({"rid": rid})
        try:
            async with asyncio.timeout(5):
                with await self.upstream.post(worker_url, "/abort_request", body, JSON) as answer:
                    await answer.read()
        except (OSError, TimeoutError) as error:
            log.info("abort of %s at %s: %s", rid, worker_url, error)
            return False
        return True


@dataclass
class _EngineTrack:
    """A streamed answer of an engine, told to the router as it goes. A client that leaves
    is the slot's to settle, on its way out."""

    calls: EngineCalls
    slot: Slot
    inference: Inference
    rid: str
    tenant: str
    shown: bool = True  # its client sees its events as they come (not a gathered answer)

    @property
    def ticket(self) -> Ticket:
        return self.slot.ticket

    @property
    def name(self) -> str:
        return self.ticket.worker_id

    def taken(self) -> Outcome | None:
        return self.slot.taken() if self.slot.preempted else None

    def first_byte(self) -> None:
        slot = self.slot
        if slot.victim is not None and self.shown:  # its client sees it from now: never requeued
            slot.victim.shown = True
        if slot.rescue is not None:
            slot.rescue.cancel()
            slot.rescue = None
        self.calls.router.first_byte(self.ticket)
        self.calls.admission.notify(self.ticket.model)

    def progressed(self, events: int) -> None:
        self.calls.router.progressed(self.ticket, events)

    def failed(self, broke: bool) -> bool:
        return self.calls._failed(self.ticket, broke)

    def finished(self, usage: Usage, transcript: Transcript) -> None:
        self.calls._finished(self.ticket, self.inference, usage)
        quality = self.calls.quality
        if quality is not None:
            answer = answers.from_transcript(transcript, self.inference)
            quality.observe(self.ticket.worker_id, self.rid, answer,
                            partial(answers.prompt_text, self.inference), self.inference.key,
                            self.tenant)  # fmt: skip


@dataclass
class PrefillHalf:
    """A PD request's prefill half, running beside its decode call in its own task, which
    holds the prefill worker's slot."""

    worker_id: str
    fields: bytes  # the bootstrap fields both bodies carry
    task: asyncio.Task[bool]


def _drop(call: asyncio.Future[Answer]) -> None:
    """Give up a call: cancelled if still on its way, its connection closed if it got one."""
    if not call.done():
        call.cancel()
    elif not call.cancelled() and call.exception() is None:
        call.result().close()
