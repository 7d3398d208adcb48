"""Operator endpoints: apply, revision, audit log, health and readiness."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Annotated, Any

import yaml
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from sqlalchemy import text

from controlplane.api.deps import CurrentPrincipal, ServicesDep, allowed
from controlplane.api.problems import problem
from controlplane.db import migrate
from controlplane.domain import Role
from controlplane.errors import MalformedBody, UnsupportedMediaType
from controlplane.metrics import CONTENT_TYPE
from controlplane.schemas.common import NAME_PATTERN, SLUG_PATTERN
from controlplane.services import audit
from controlplane.services.apply import apply_plan, parse_document, required_role

router = APIRouter()

YAML_TYPES = {"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"}
MAX_DOCUMENT = 4 * 1024 * 1024
PARSE_ON_LOOP = 64 * 1024  # bytes: a larger document is parsed in a thread
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's: ten times faster

_DOCUMENT_BODY = {
    "requestBody": {
        "required": True,
        "description": "a fleet document (see examples/fleet.yaml)",
        "content": {
            "application/yaml": {"schema": {"type": "object"}},
            "application/json": {"schema": {"type": "object"}},
        },
    }
}


async def _read_document(request: Request) -> Any:
    media = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    raw = await request.body()
    if len(raw) > MAX_DOCUMENT:
        raise MalformedBody(f"the document is larger than {MAX_DOCUMENT} bytes")
    try:
        if media == "application/json":
            return await _parsed(json.loads, raw)
        if media in YAML_TYPES:
            return await _parsed(_yaml, raw)
    except (ValueError, yaml.YAMLError) as exc:
        raise MalformedBody(f"the document cannot be parsed: {exc}") from exc
    raise UnsupportedMediaType(
        f"send the document as application/json or application/yaml, not {media}"
    )


def _yaml(raw: bytes) -> Any:
    return yaml.load(raw, Loader=YAML_LOADER)  # noqa: S506 (a safe loader)


async def _parsed(parse: Callable[[bytes], Any], raw: bytes) -> Any:
    """A large document is parsed off the event loop (a thousand objects take a second)."""
    if len(raw) < PARSE_ON_LOOP:
        return parse(raw)
    return await asyncio.to_thread(parse, raw)


@router.post(
    "/v1/apply",
    tags=["apply"],
    summary="Make the fleet match a document (an admin's, when it lists access kinds)",
    **allowed(Role.OPERATOR, extra=_DOCUMENT_BODY),
)
async def apply(
    request: Request,
    services: ServicesDep,
    who: CurrentPrincipal,
    dry_run: Annotated[bool, Query(description="show the diff, change nothing")] = False,
    cascade: Annotated[bool, Query(description="let deletes take dependents along")] = False,
    prune: Annotated[
        bool,
        Query(description="delete the objects of the kinds it names that it leaves out"),
    ] = True,
) -> dict[str, Any]:
    plan = parse_document(await _read_document(request))
    who.require(required_role(plan))
    return await apply_plan(
        services.db, services.feed, plan, who.name, dry_run=dry_run, cascade=cascade,
        prune=prune, sealer=services.resources.sealer,
    )  # fmt: skip


@router.get(
    "/v1/revision", tags=["operator"], summary="The global config revision", **allowed(Role.VIEWER)
)
async def revision(services: ServicesDep) -> dict[str, int]:
    return {"revision": await audit.revision(services.db)}


@router.get(
    "/v1/audit-events",
    tags=["operator"],
    summary="The audit log, newest first",
    **allowed(Role.VIEWER),
)
async def audit_events(
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[
        str | None, Query(pattern=r"^[0-9]{1,18}$", description="`next` of the last page")
    ] = None,
    kind: Annotated[str | None, Query(pattern=SLUG_PATTERN, description="e.g. region")] = None,
    name: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=63)] = None,
) -> dict[str, Any]:
    return await audit.audit_events(services.db, limit=limit, cursor=cursor, kind=kind, name=name)


@router.get(
    "/metrics",
    tags=["operator"],
    summary="Prometheus metrics of this replica",
    response_class=PlainTextResponse,
    **allowed(Role.VIEWER),
)
async def metrics(request: Request) -> Response:
    body = await request.app.state.metrics.render()
    return Response(body, media_type=CONTENT_TYPE)


@router.get("/healthz", tags=["operator"], summary="The process is up")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", tags=["operator"], summary="The database is reachable and migrated")
async def readyz(request: Request, services: ServicesDep) -> JSONResponse:
    try:
        async with services.db.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        at = await migrate.current(services.db.engine)
    except Exception as exc:
        return problem(
            503, "not_ready", "Not ready", f"database unreachable: {exc}", request.url.path
        )
    if at != migrate.head():
        return problem(
            503,
            "not_ready",
            "Not ready",
            f"schema at {at}, code expects {migrate.head()}: run `meridian controlplane migrate`",
            request.url.path,
        )
    return JSONResponse({"status": "ready", "schema": at})


@router.get(
    "/v1/cluster",
    tags=["operator"],
    summary="The control-plane replicas: this one, the leader, and every live one",
    **allowed(Role.VIEWER),
)
async def cluster(services: ServicesDep) -> dict[str, Any]:
    return await services.coordinator.cluster()
