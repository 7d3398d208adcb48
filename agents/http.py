"""The one HTTP app on the agent's port: the gateway's OpenAI and SGLang routes, /healthz, and
/agent/* behind the operator token.

Whatever the port answers is OpenAI-shaped, aiohttp's own answers included: an unknown path
(404), a wrong method (405 with Allow), a request whose head cannot be parsed (400, logged at
WARNING without a traceback, the input never echoed back). No answer names the server's
software."""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import logging
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web, web_protocol, web_request, web_server
from prometheus_client.core import Metric

from agents.gateway import models, openapi
from agents.gateway.auth import bearer, same_secret
from agents.gateway.batches import PATHS as BATCH_PATHS
from agents.gateway.batches import BatchProxy
from agents.gateway.errors import (
    SERVER,
    BadRequest,
    BodyTooLarge,
    GatewayError,
    InternalError,
    MethodNotAllowed,
    NotFound,
    Unauthenticated,
)
from agents.gateway.limits import LIMITS
from agents.gateway.relay import new_id
from agents.gateway.service import Gateway
from agents.metrics import CONTENT_TYPE, render
from agents.router.router import DECISIONS_KEPT

log = logging.getLogger(__name__)
VERSION = importlib.metadata.version("meridian")


def build_app(
    gateway: Gateway,
    status: Callable[[], dict[str, Any]],
    operator_token: str,
    state: Callable[[], list[Metric]] = list,
    batches: BatchProxy | None = None,
) -> web.Application:
    async def healthz(_request: web.Request) -> web.Response:
        return _json({"status": "ok"})

    def refused(request: web.Request) -> web.Response | None:
        if not same_secret(bearer(request.headers.get("Authorization")), operator_token):
            error: GatewayError = Unauthenticated("/agent/* needs the operator token")
            return error.response({})
        return None

    async def agent_status(request: web.Request) -> web.Response:
        return refused(request) or _json(status())

    async def decisions(request: web.Request) -> web.Response:
        """The router's latest decisions, newest first, each with why it was made."""
        try:
            limit = max(1, min(DECISIONS_KEPT, int(request.query.get("limit", "50"))))
        except ValueError:
            return BadRequest("limit must be a whole number", param="limit").response({})
        return refused(request) or _json(gateway.router.recent_decisions(limit))

    async def prometheus(request: web.Request) -> web.Response:
        """Prometheus text; behind the operator token, as /agent/* is (it names tenants)."""
        denied = refused(request)
        if denied is not None:
            return denied
        body = await render(gateway.metrics, state())
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE, "Server": SERVER})

    async def openapi_document(_request: web.Request) -> web.Response:
        """The public surface's OpenAPI document, with the models served here now."""
        config = gateway.config
        models = sorted(config.models) if config is not None else []
        return _json(openapi.document(models, VERSION))

    async def elsewhere(request: web.Request) -> web.Response:
        """Any other path or method: 404, or 405 with what the path takes."""
        path = request.path
        allowed = ROUTES.get(path) or (("GET",) if path.startswith(MODEL_PATH) else None)
        error: GatewayError = (
            MethodNotAllowed("this endpoint does not take that method")
            if allowed
            else NotFound("there is no such endpoint")
        )
        headers = {"X-Request-ID": new_id()}
        if allowed:
            headers["Allow"] = ", ".join(allowed)
        return error.response(headers)

    app = web.Application(client_max_size=gateway.limits.max_body_bytes)
    app[LIMITS] = gateway.limits
    app.router.add_post("/v1/chat/completions", gateway.infer)
    app.router.add_post("/v1/completions", gateway.infer)
    app.router.add_post("/generate", gateway.infer)
    app.router.add_get("/v1/models", functools.partial(models.list_models, gateway))
    app.router.add_get(MODEL_PATH + "{model}", functools.partial(models.retrieve_model, gateway))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/openapi.json", openapi_document)
    app.router.add_get("/agent/status", agent_status)
    app.router.add_get("/agent/decisions", decisions)
    app.router.add_get("/metrics", prometheus)
    if batches is not None:
        for path in BATCH_PATHS:
            app.router.add_route("*", path, batches.forward)
    app.router.add_route("*", "/{tail:.*}", elsewhere)  # last: after every route above
    return app


MODEL_PATH = "/v1/models/"
ROUTES = {  # what each path takes (a GET route takes HEAD too)
    "/v1/chat/completions": ("POST",),
    "/v1/completions": ("POST",),
    "/generate": ("POST",),
    **{path: ("GET", "HEAD") for path in
       ("/v1/models", "/healthz", "/openapi.json", "/agent/status", "/agent/decisions",
        "/metrics")},
}  # fmt: skip


def _json(doc: Any) -> web.Response:
    return web.Response(
        body=orjson.dumps(doc), content_type="application/json", headers={"Server": SERVER}
    )


class _Handler(web_protocol.RequestHandler):
    """aiohttp's connection handler, whose own answers (a head it cannot parse, a fault
    outside every handler) are OpenAI-shaped like the gateway's."""

    def handle_error(
        self,
        request: web_request.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # an answer began: the connection is broken
            raise ConnectionError("an answer had begun; the connection is closed")
        error: GatewayError
        if status == 500:
            log.error("a request from %s failed outside the gateway", request.remote, exc_info=exc)
            error = InternalError()
        elif status == 413:
            error = BodyTooLarge("the request is too large")
        else:
            log.warning("a request from %s could not be parsed: %s", request.remote, type(exc))
            error = BadRequest("the request could not be parsed as HTTP/1.1")
            error.status = status if 400 <= status < 500 else 400
        response = error.response({"X-Request-ID": new_id()})
        response.force_close()
        return response


class _Server(web_server.Server):
    def __call__(self) -> web_protocol.RequestHandler:
        return _Handler(self, loop=self._loop, **self._kwargs)


class Runner(web.AppRunner):
    """The app's runner, with the connection handler above. `header_timeout_s`: a connection
    whose request head has not come this long after it opened or after its last answer is
    closed (aiohttp's keep-alive timeout covers both): slow senders, and idle keep-alive
    connections."""

    def __init__(self, app: web.Application, header_timeout_s: float) -> None:
        super().__init__(
            app, access_log=None, handler_cancellation=True, keepalive_timeout=header_timeout_s
        )

    async def _make_server(self) -> web_server.Server:
        app = self.app
        app._set_loop(asyncio.get_running_loop())
        app.on_startup.freeze()
        await app.startup()
        app.freeze()
        return _Server(
            app._handle,  # type: ignore[arg-type]
            request_factory=app._make_request,
            loop=asyncio.get_running_loop(),
            debug=False,
            **self._kwargs,
        )
