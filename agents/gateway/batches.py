"""OpenAI's Files and Batches API on the agent's port: the tenant's key is checked here, as
for any request (known, not expired, its tenant served in this region), and the call is
passed on to the control plane, which keeps files and batches
(`MERIDIAN_AGENT_CONTROL_PLANE_URL`, its HTTP API). The body streams through: a file may be
larger than an inference request may. Batches' lines run as the batch class wherever the
tenant's residency allows, sent by the control plane's runner."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
from aiohttp import web

from agents.config import RegionConfig
from agents.gateway.auth import authenticate
from agents.gateway.errors import GatewayError, NotReady, UpstreamFailed
from agents.gateway.relay import new_id

PATHS = ("/v1/files", "/v1/files/{file_id}", "/v1/files/{file_id}/content", "/v1/batches",
         "/v1/batches/{batch_id}", "/v1/batches/{batch_id}/cancel")  # fmt: skip
PASSED = ("Authorization", "Content-Type", "Content-Length")
TIMEOUT = aiohttp.ClientTimeout(total=600, sock_connect=10)


class BatchUnavailable(GatewayError):
    status, code, kind = 501, "batch_api_unavailable", "api_error"
    title = "The Batch API is not reachable here"


class BatchProxy:
    def __init__(self, url: str | None, config: Callable[[], RegionConfig | None]) -> None:
        self.url = url.rstrip("/") if url else None
        self.config = config
        self._http: aiohttp.ClientSession | None = None

    async def forward(self, request: web.Request) -> web.StreamResponse:
        headers = {"X-Request-ID": new_id()}
        try:
            return await self._forward(request, headers)
        except GatewayError as error:
            return error.response(headers)

    async def _forward(self, request: web.Request, headers: dict[str, str]) -> web.Response:
        if self.url is None:
            raise BatchUnavailable(
                "this agent is not told the control plane's API (MERIDIAN_AGENT_CONTROL_PLANE_URL)"
            )
        config = self.config()
        if config is None:
            raise NotReady("this agent has no snapshot yet", retry_after_s=2)
        authenticate(request.headers.get("Authorization"), config)
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=TIMEOUT)
        passed = {k: v for k in PASSED if (v := request.headers.get(k)) is not None}
        body = request.content if request.body_exists else None
        try:
            async with self._http.request(request.method, self.url + request.path_qs,
                                          data=body, headers=passed) as answer:  # fmt: skip
                data = await answer.read()
                kind = answer.headers.get("Content-Type", "application/json")
                status = answer.status
        except (aiohttp.ClientError, TimeoutError) as error:
            raise UpstreamFailed(f"the control plane did not answer: {error}") from None
        return web.Response(body=data, status=status, headers={**headers, "Content-Type": kind})

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
