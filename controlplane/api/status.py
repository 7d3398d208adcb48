"""The web status page (`/` and `/status`) and the document it shows (`GET /v1/status`).

The page is a static shell (HTML, two scripts, one stylesheet, all served from here: it works
offline and loads nothing from elsewhere). It holds no data: it asks for a token, or signs the
person in through the identity provider (the only other origin it may talk to: its token
endpoint), keeps the token in the tab's session storage, never in a URL, and polls
`/v1/status` with it. The document needs a viewer or above.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse

from controlplane.api.deps import Services, ServicesDep, allowed
from controlplane.domain import Role
from controlplane.errors import MeridianError, NotFound
from controlplane.services.status import StatusCache

STATIC = Path(__file__).with_name("static")
ASSETS = {"app.js": "text/javascript", "sso.js": "text/javascript", "app.css": "text/css",
          "favicon.svg": "image/svg+xml"}  # fmt: skip


def page_headers(connect: str = "") -> dict[str, str]:
    """Only this origin's scripts, style and API (and the identity provider's token endpoint,
    `connect`); no inline script, no frames, no form posts."""
    return {
        "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
        f"connect-src 'self'{connect}; img-src 'self'; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }


async def _provider_origin(services: Services) -> str:
    """` <origin>` of the identity provider's token endpoint, for connect-src; its issuer's
    while the provider cannot be reached (the page then says the sign-in failed)."""
    oidc = services.auth.oidc
    if oidc is None:
        return ""
    try:
        endpoint = str((await oidc.metadata()).get("token_endpoint") or oidc.issuer)
    except MeridianError:
        endpoint = oidc.issuer
    url = httpx.URL(endpoint)
    port = f":{url.port}" if url.port else ""
    return f" {url.scheme}://{url.host}{port}"


router = APIRouter()


@router.get(
    "/v1/status",
    tags=["operator"],
    summary="The fleet as the status page shows it: regions, revisions and acks, nodes, GPUs "
    "and engines, load, escalation flows and recent route receipts",
    **allowed(Role.VIEWER),
)
async def status(request: Request, response: Response) -> dict[str, Any]:
    response.headers["Cache-Control"] = "no-store"
    cache: StatusCache = request.app.state.status
    return await cache.get()


@router.get("/", include_in_schema=False)
@router.get("/status", include_in_schema=False)
async def page(services: ServicesDep) -> FileResponse:
    headers = page_headers(await _provider_origin(services))
    return FileResponse(STATIC / "index.html", media_type="text/html", headers=headers)


@router.get("/status/{asset}", include_in_schema=False)
async def asset(asset: str) -> Response:
    media = ASSETS.get(asset)
    if media is None:
        raise NotFound(f"the status page has no asset {asset!r}")
    return FileResponse(STATIC / asset, media_type=media, headers=page_headers())
