"""One router per kind: list, get, create, replace, patch and delete, all alike.

No `from __future__ import annotations` here: FastAPI must see each kind's body type itself.
"""

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Response
from fastapi.responses import JSONResponse

from controlplane.api.deps import CurrentPrincipal, IfMatch, ServicesDep, etag
from controlplane.domain import Role
from controlplane.errors import ValidationFailed
from controlplane.schemas.common import NAME_PATTERN, Page
from controlplane.services.kind import Kind
from controlplane.services.resources import Written

NamePath = Annotated[str, Path(pattern=NAME_PATTERN, max_length=63)]
Limit = Annotated[int, Query(ge=1, le=500, description="items per page")]
Cursor = Annotated[str | None, Query(max_length=200, description="`next` of the last page")]


def _written(written: Written, status: int = 200, location: str | None = None) -> JSONResponse:
    headers = {"ETag": etag(written.view["version"])}
    if location:
        headers["Location"] = location
    if written.revision is not None:
        headers["X-Meridian-Revision"] = str(written.revision)
    return JSONResponse({**written.view, **written.secret}, status_code=status, headers=headers)


def kind_router(kind: Kind[Any]) -> APIRouter:
    router = APIRouter(prefix=f"/v1/{kind.plural}", tags=[kind.plural])
    create_body = kind.create_schema
    update_body = kind.replace_schema
    one = {"model": kind.out, "description": f"the {kind.kind}"}

    @router.get("", response_model=Page, summary=f"List {kind.plural}")
    async def list_(
        services: ServicesDep, who: CurrentPrincipal, limit: Limit = 100, cursor: Cursor = None
    ) -> dict[str, Any]:
        who.require(Role.VIEWER)
        return await services.resources.list(kind, limit=limit, cursor=cursor)

    @router.get("/{name}", responses={200: one}, summary=f"Get a {kind.kind}")
    async def get(name: NamePath, services: ServicesDep, who: CurrentPrincipal) -> JSONResponse:
        who.require(Role.VIEWER)
        view = await services.resources.get(kind, name)
        return JSONResponse(view, headers={"ETag": etag(view["version"])})

    @router.post("", status_code=201, responses={201: one}, summary=f"Create a {kind.kind}")
    async def create(
        body: create_body,  # type: ignore[valid-type]
        services: ServicesDep,
        who: CurrentPrincipal,
    ) -> JSONResponse:
        who.require(kind.write_role)
        name = body.name  # type: ignore[attr-defined]
        spec = kind.spec.model_validate(body.model_dump(exclude={"name"}))  # type: ignore[attr-defined]
        written = await services.resources.create(kind, name, spec, who.name)
        return _written(written, 201, f"/v1/{kind.plural}/{written.view['name']}")

    @router.delete("/{name}", status_code=204, summary=f"Delete a {kind.kind}")
    async def delete(
        name: NamePath,
        services: ServicesDep,
        who: CurrentPrincipal,
        expected: IfMatch,
        cascade: Annotated[bool, Query(description="delete what depends on it too")] = False,
    ) -> Response:
        who.require(kind.write_role)
        revision = await services.resources.delete(kind, name, expected, who.name, cascade=cascade)
        headers = {"X-Meridian-Revision": str(revision)} if revision is not None else None
        return Response(status_code=204, headers=headers)

    if not kind.updatable:
        return router

    @router.put("/{name}", responses={200: one}, summary=f"Replace a {kind.kind}")
    async def replace(
        name: NamePath,
        body: update_body,  # type: ignore[valid-type]
        services: ServicesDep,
        who: CurrentPrincipal,
        expected: IfMatch,
    ) -> JSONResponse:
        who.require(kind.write_role)
        given = getattr(body, "name", None)
        if given is not None and given != name:
            raise ValidationFailed(
                "the body names another object",
                [{"field": "body.name", "message": f"is {given!r}, the path says {name!r}"}],
            )
        spec_type = kind.update_spec or kind.spec
        spec = spec_type.model_validate(body.model_dump(exclude={"name"}))  # type: ignore[attr-defined]
        return _written(await services.resources.replace(kind, name, spec, expected, who.name))

    @router.patch(
        "/{name}",
        responses={200: one},
        summary=f"Change fields of a {kind.kind} (JSON merge patch, RFC 7396)",
    )
    async def patch(
        name: NamePath,
        body: Annotated[dict[str, Any], Body(description="the fields to change; null removes")],
        services: ServicesDep,
        who: CurrentPrincipal,
        expected: IfMatch,
    ) -> JSONResponse:
        who.require(kind.write_role)
        return _written(await services.resources.patch(kind, name, body, expected, who.name))

    return router
