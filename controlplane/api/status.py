"""The web status page (`/` and `/status`) and the document it shows (`GET /v1/status`).

The page is a static shell (HTML, one script, one stylesheet, all served from here: it works
offline and loads nothing from elsewhere). It holds no data: it asks for a token, keeps it in
the tab's session storage, never in a URL, and polls `/v1/status` with it. The document needs
a viewer or above.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse

from controlplane.api.deps import allowed
from controlplane.domain import Role
from controlplane.errors import NotFound
from controlplane.services.status import StatusCache

STATIC = Path(__file__).with_name("static")
ASSETS = {"app.js": "text/javascript", "app.css": "text/css", "favicon.svg": "image/svg+xml"}
# Only this origin's script, style and API; no inline script, no frames, no form posts.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

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
async def page() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html", headers=PAGE_HEADERS)


@router.get("/status/{asset}", include_in_schema=False)
async def asset(asset: str) -> Response:
    media = ASSETS.get(asset)
    if media is None:
        raise NotFound(f"the status page has no asset {asset!r}")
    return FileResponse(STATIC / asset, media_type=media, headers=PAGE_HEADERS)
