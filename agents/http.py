"""The one HTTP app on the agent's port: the gateway's OpenAI and SGLang routes, /healthz, and
/agent/* behind the operator token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web
from prometheus_client.core import Metric

from agents.gateway.auth import bearer, same_secret
from agents.gateway.errors import BadRequest, GatewayError, Unauthenticated
from agents.gateway.service import Gateway
from agents.metrics import CONTENT_TYPE, render
from agents.router.router import DECISIONS_KEPT


def build_app(
    gateway: Gateway,
    status: Callable[[], dict[str, Any]],
    operator_token: str | None,
    state: Callable[[], list[Metric]] = list,
) -> web.Application:
    async def healthz(_request: web.Request) -> web.Response:
        return _json({"status": "ok"})

    def refused(request: web.Request) -> web.Response | None:
        if operator_token is not None and not same_secret(
            bearer(request.headers.get("Authorization")), operator_token
        ):
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
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    app = web.Application(client_max_size=gateway.limits.max_body_bytes)
    app.router.add_post("/v1/chat/completions", gateway.infer)
    app.router.add_post("/v1/completions", gateway.infer)
    app.router.add_post("/generate", gateway.infer)
    app.router.add_get("/v1/models", gateway.models_or_error)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/agent/status", agent_status)
    app.router.add_get("/agent/decisions", decisions)
    app.router.add_get("/metrics", prometheus)
    return app


def _json(doc: Any) -> web.Response:
    return web.Response(body=orjson.dumps(doc), content_type="application/json")
