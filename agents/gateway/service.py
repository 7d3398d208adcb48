"""The gateway: OpenAI API in, auth, quotas, admission, the router's choice, the engine's bytes
out. The only I/O on a request's path is the call to the engine.

A worker that fails before the first byte reaches the client (refused, reset, 5xx, a stream
that ends before its first event) has the request retried on the next worker. A client that
goes away has its upstream request closed and aborted, so the engine stops working on it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from aiohttp import web

from agents.control.compile import RegionConfig, Tenant
from agents.gateway import auth
from agents.gateway.admission import Admission
from agents.gateway.errors import GatewayError, NotReady, UnsupportedMediaType, UpstreamFailed
from agents.gateway.quotas import Quotas
from agents.gateway.relay import (
    EVENT_END,
    ClientGone,
    Retry,
    StreamMeter,
    Usage,
    body_usage,
    new_id,
    relayed_headers,
    stream_error,
    to_client,
    upstream_headers,
    write_quietly,
)
from agents.gateway.requests import Inference, check_context, parse
from agents.gateway.upstream import Answer, Upstream, UpstreamError
from agents.router.decision import Decision, Ticket
from agents.router.policies import Candidate, RouteRequest
from agents.router.router import Router

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 3
OPERATOR = Tenant("operator", "operator", None, None, None)
JSON = b"Content-Type: application/json\r\n"


class Gateway:
    def __init__(
        self,
        router: Router,
        *,
        operator_token: str | None,
        connect_timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.router = router
        self.admission = Admission(router, clock)
        self.quotas = Quotas(clock)
        self.config: RegionConfig | None = None
        self.operator_token = operator_token
        self.clock = clock
        self._upstream = Upstream(connect_timeout_s)
        self._background: set[asyncio.Task[object]] = set()
        router.table.on_change(self.admission.notify_all)

    async def close(self) -> None:
        await self._upstream.close()

    def configure(self, config: RegionConfig) -> None:
        self.router.configure(config)
        self.config = config

    def headers(self, request_id: str) -> dict[str, str]:
        region = self.config.region if self.config is not None else ""
        return {"X-Request-ID": request_id, "x-meridian-region": region}

    async def models_or_error(self, request: web.Request) -> web.Response:
        try:
            return await self._models(request)
        except GatewayError as error:
            return error.response(self.headers(new_id()))

    async def _models(self, request: web.Request) -> web.Response:
        config = self._config()
        self._caller(request, config)
        created = int(time.time())
        data = [
            {"id": m.name, "object": "model", "created": created, "owned_by": "meridian",
             "root": m.name, "max_model_len": m.context_length}
            for m in sorted(config.models.values(), key=lambda m: m.name)
        ]  # fmt: skip
        return web.Response(
            body=orjson.dumps({"object": "list", "data": data}),
            content_type="application/json",
            headers={"x-meridian-region": config.region},
        )

    async def infer(self, request: web.Request) -> web.StreamResponse:
        request_id = request.headers.get("X-Request-ID") or new_id()
        headers = self.headers(request_id[:128])
        try:
            return await self._infer(request, request_id[:128], headers)
        except GatewayError as error:
            return error.response(headers)

    def _config(self) -> RegionConfig:
        if self.config is None:
            raise NotReady("this agent has no snapshot yet", retry_after_s=2)
        return self.config

    def _caller(self, request: web.Request, config: RegionConfig) -> tuple[Tenant, bool]:
        """The tenant, and whether it may see the fleet's inside."""
        header = request.headers.get("Authorization")
        if self.operator_token and auth.same_secret(auth.bearer(header), self.operator_token):
            return OPERATOR, True
        tenant = auth.authenticate(header, config)
        return tenant, tenant.debug_routes

    async def _infer(
        self, request: web.Request, request_id: str, headers: dict[str, str]
    ) -> web.StreamResponse:
        since = self.clock()
        config = self._config()
        tenant, insider = self._caller(request, config)
        if request.content_type not in ("application/json", ""):
            raise UnsupportedMediaType(f"send application/json, not {request.content_type}")
        inference, model = parse(request.path, await request.read(), config)
        route_request = self.router.request(
            model.name, inference.key, inference.tokens, inference.max_new
        )
        check_context(model, route_request.prompt_tokens)
        route = config.routes.get(model.name)
        if route is None:
            raise UpstreamFailed(f"region {config.region} has no route for {model.name}")
        if tenant is not OPERATOR:
            self.quotas.admit(tenant, route_request.prompt_tokens)
        debug = insider and request.headers.get("x-meridian-debug") == "1"
        tried: set[str] = set()
        try:
            for attempt in range(MAX_ATTEMPTS):
                decision = await self.admission.place(route, route_request, tried, since)
                self.router.record(request_id, decision)
                chosen = decision.ranked[0]
                if debug:
                    queued_ms = round((self.clock() - since) * 1000, 1)  # in admission
                    extra = {"attempt": attempt + 1, "queued_ms": queued_ms}
                    headers["x-meridian-route"] = orjson.dumps(
                        decision.describe(chosen.worker.id) | extra
                    ).decode()
                try:
                    response, usage = await self._attempt(
                        request, inference, request_id, decision, route_request, headers
                    )
                except Retry as why:
                    log.warning("request %s: %s", request_id, why, extra={"request_id": request_id})
                    tried.add(why.worker_id)
                    since = self.clock()  # time lost to a failed worker is not the load's
                    continue
                if tenant is not OPERATOR and usage.prompt_tokens is not None:
                    used = usage.prompt_tokens + (usage.completion_tokens or 0)
                    self.quotas.settle(tenant, route_request.prompt_tokens, used)
                return response
        except GatewayError:
            if tenant is not OPERATOR:
                self.quotas.settle(tenant, route_request.prompt_tokens, 0)
            raise
        raise UpstreamFailed(f"{MAX_ATTEMPTS} workers failed the request", retry_after_s=1)

    async def _attempt(
        self,
        request: web.Request,
        inference: Inference,
        request_id: str,
        decision: Decision,
        route_request: RouteRequest,
        headers: dict[str, str],
    ) -> tuple[web.StreamResponse, Usage]:
        chosen, prefill = decision.ranked[0], decision.prefill
        worker = chosen.worker
        ticket = self.router.dispatched(chosen, route_request, prefilled_elsewhere=bool(prefill))
        sent_headers = upstream_headers(request_id)
        pd: _Prefill | None = None
        if prefill is not None:
            pd = self._prefill(prefill, route_request, inference, request_id, sent_headers)
            body = inference.upstream_body(request_id, pd.fields)
        else:
            body = inference.upstream_body(request_id)
        if decision.pd is not None:
            self.router.pd_choices[decision.pd] += 1
        upstream: Answer | None = None
        try:
            if pd is None:
                upstream = await self._upstream.post(worker.url, inference.path, body, sent_headers)
            else:
                upstream = await self._paired(pd, worker.url, inference, body, sent_headers, ticket)
            if upstream.status >= 500:
                self._failed(ticket)
                raise Retry(worker.id, f"answered {upstream.status}")
            if inference.stream and upstream.status == 200:
                return await self._stream(request, inference, upstream, ticket, headers, request_id)
            data = await upstream.read()
        except OSError as error:  # UpstreamError among them
            self._failed(ticket)
            raise Retry(worker.id, f"{type(error).__name__}: {error}") from None
        except asyncio.CancelledError:
            self._gone(ticket, worker.url, request_id)
            if pd is not None:
                pd.cancel()
            raise
        except Exception:  # a fault of ours: the worker's request ends here all the same
            self.router.abandoned(ticket)
            raise
        finally:
            if upstream is not None:
                upstream.release()
        usage = body_usage(data, inference.native) if upstream.status == 200 else Usage()
        self._finished(ticket, inference, usage)
        out = relayed_headers(upstream.headers)
        out.update(headers)
        return web.Response(body=data, status=upstream.status, headers=out), usage

    async def _stream(
        self,
        request: web.Request,
        inference: Inference,
        upstream: Answer,
        ticket: Ticket,
        headers: dict[str, str],
        rid: str,
    ) -> tuple[web.StreamResponse, Usage]:
        meter = StreamMeter(inference.native, keep_usage=inference.wants_usage)
        response: web.StreamResponse | None = None
        try:
            async for chunk in upstream.chunks():
                data = meter.feed(chunk)
                if not data:
                    continue
                if response is None:
                    self.router.first_byte(ticket)
                    self.admission.notify(ticket.model)
                    response = web.StreamResponse(headers=headers)
                    response.content_type = "text/event-stream"
                    response.headers["Cache-Control"] = "no-cache"
                    await to_client(response.prepare(request))
                await to_client(response.write(data))
                self.router.progressed(ticket, data.count(EVENT_END))
            rest = meter.rest()
        except ClientGone:
            self._gone(ticket, upstream.url, rid)
            assert response is not None  # only writes to the client raise it
            return response, meter.usage
        except asyncio.CancelledError:
            self._gone(ticket, upstream.url, rid)
            raise
        except UpstreamError as error:
            self._failed(ticket)
            if response is None:  # nothing reached the client: another worker may answer
                raise Retry(ticket.worker_id, f"stream broke: {error}") from None
            await write_quietly(response, stream_error("the engine's stream broke"))
            return response, meter.usage
        if response is None:
            self._failed(ticket)
            raise Retry(ticket.worker_id, "the stream ended before its first event")
        if rest:
            await write_quietly(response, rest, eof=False)
        usage = meter.finish()
        self._finished(ticket, inference, usage)
        await write_quietly(response, b"")
        return response, usage

    def _prefill(
        self,
        prefill: Candidate,
        route_request: RouteRequest,
        inference: Inference,
        request_id: str,
        headers: bytes,
    ) -> _Prefill:
        """PD: the same body to the prefill worker, with the bootstrap fields SGLang expects;
        its answer is read and dropped (the client gets the decode worker's)."""
        worker = prefill.worker
        ticket = self.router.dispatched(prefill, route_request)
        room = secrets.randbits(63)
        fields = (
            b'"bootstrap_host":' + orjson.dumps(worker.host)
            + b',"bootstrap_port":' + str(worker.bootstrap_port).encode()
            + b',"bootstrap_room":' + str(room).encode() + b","
        )  # fmt: skip
        body = inference.upstream_body(request_id, fields)
        call = self._prefill_call(worker.url, inference.path, body, headers, ticket)
        task = asyncio.get_running_loop().create_task(call)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return _Prefill(self, worker.url, request_id, ticket, fields, task)

    async def _prefill_call(
        self, url: str, path: str, body: bytes, headers: bytes, ticket: Ticket
    ) -> bool:
        try:
            answer = await self._upstream.post(url, path, body, headers)
            try:
                await answer.read()
            finally:
                answer.release()
            if answer.status >= 500:
                self._failed(ticket)
                return False
        except OSError:
            self._failed(ticket)
            return False
        self.router.first_byte(ticket)
        self.router.finished(ticket, 0, None, None)
        return True

    async def _paired(
        self,
        pd: _Prefill,
        worker_url: str,
        inference: Inference,
        body: bytes,
        headers: bytes,
        ticket: Ticket,
    ) -> Answer:
        """The decode call, given up (and retried on another pair) if the prefill fails
        before the decode worker has answered."""
        call = self._upstream.post(worker_url, inference.path, body, headers)
        decode = asyncio.ensure_future(call)
        await asyncio.wait({decode, pd.task}, return_when=asyncio.FIRST_COMPLETED)
        if not decode.done() and not pd.task.result():
            decode.cancel()
            self.router.abandoned(ticket)
            self._abort_later(worker_url, pd.request_id)
            raise Retry(pd.ticket.worker_id, "the prefill worker failed")
        return await decode

    def _finished(self, ticket: Ticket, inference: Inference, usage: Usage) -> None:
        self.router.finished(
            ticket, len(inference.key), usage.prompt_tokens, usage.completion_tokens
        )
        self.admission.notify(ticket.model)

    def _failed(self, ticket: Ticket) -> None:
        self.router.failed(ticket)
        self.admission.notify(ticket.model)

    def _gone(self, ticket: Ticket, worker_url: str, rid: str) -> None:
        """The client went away: free the worker and tell the engine to stop."""
        if ticket.done:
            return
        self.router.abandoned(ticket)
        self.admission.notify(ticket.model)
        self._abort_later(worker_url, rid)

    def _abort_later(self, worker_url: str, rid: str) -> None:
        if not rid:
            return
        task = asyncio.get_running_loop().create_task(self._abort(worker_url, rid))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort(self, worker_url: str, rid: str) -> None:
        body = orjson.dumps({"rid": rid})
        try:
            async with asyncio.timeout(5):
                answer = await self._upstream.post(worker_url, "/abort_request", body, JSON)
                try:
                    await answer.read()
                finally:
                    answer.release()
        except (OSError, TimeoutError) as error:
            log.info("abort of %s at %s: %s", rid, worker_url, error)


@dataclass
class _Prefill:
    """A PD request's prefill half, running beside its decode call."""

    gateway: Gateway
    worker_url: str
    request_id: str
    ticket: Ticket
    fields: bytes  # the bootstrap fields both bodies carry
    task: asyncio.Task[bool]

    def cancel(self) -> None:
        if not self.task.done():
            self.task.cancel()
            self.gateway._gone(self.ticket, self.worker_url, self.request_id)
