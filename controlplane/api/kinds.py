"""One router per kind: list, get, create, replace, patch and delete, all alike.

No `from __future__ import annotations` here: FastAPI must see each kind's body type itself.
"""

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query, Response
from fastapi.responses import JSONResponse

from controlplane.api.deps import CurrentPrincipal, IfMatch, ServicesDep, allowed, etag
from controlplane.domain import Role
from controlplane.errors import ValidationFailed
from controlplane.schemas.access import SecretRotation
from controlplane.schemas.common import NAME_PATTERN, Page
from controlplane.services.kind import Kind
from controlplane.services.resources import Written, check_version

NamePath = Annotated[str, Path(pattern=NAME_PATTERN, max_length=63)]
Limit = Annotated[int, Query(ge=1, le=500, description="items per page")]
Cursor = Annotated[
    str | None, Query(pattern=NAME_PATTERN, max_length=63, description="`next` of the last page")
]


def written_response(
    written: Written, status: int = 200, location: str | None = None
) -> JSONResponse:
    headers = {"ETag": etag(written.view["version"])}
    if location:
        headers["Location"] = location
    if written.revision is not None:
        headers["X-Meridian-Revision"] = str(written.revision)
    return JSONResponse({**written.view, **written.secret}, status_code=status, headers=headers)


def precondition_of(kind: Kind[Any]) -> Callable[..., Awaitable[set[int] | str]]:
    """The If-Match precondition of a write to an object of `kind`: a route's dependency."""

    async def precondition(
        name: NamePath, who: CurrentPrincipal, services: ServicesDep, expected: IfMatch
    ) -> set[int] | str:
        """If-Match against the stored version; the write checks it again under its lock."""
        stored = await services.resources.version(kind, name, who.tenant)
        check_version(kind, name, stored, expected)
        assert expected is not None
        return expected

    return precondition


def kind_router(kind: Kind[Any]) -> APIRouter:
    router = APIRouter(prefix=f"/v1/{kind.plural}", tags=[kind.plural])
    create_body = kind.create_schema
    update_body = kind.replace_schema
    one = {"model": kind.out, "description": f"the {kind.kind}"}
    created = {"model": kind.created_schema, "description": f"the new {kind.kind}"}

    # What a write checks before its body is read, in RFC 9110's order (13.2.2): who asks
    # (401, 403: the route's `allowed` dependency, first), then the object (404) and the
    # precondition (428, 412); the body (422) last. FastAPI resolves dependencies before it
    # validates the body.
    # A tenant admin reads (and, for some kinds, writes) its own tenant's objects only: each
    # call below is given its tenant as the scope, and another tenant's object is not found.
    reader = allowed(Role.VIEWER, tenant_scoped=kind.tenant_scope is not None)
    writer = allowed(kind.write_role, tenant_scoped=kind.tenant_scope == "write")

    Checked = Annotated[set[int] | str, Depends(precondition_of(kind))]

    @router.get("", response_model=Page, summary=f"List {kind.plural}", **reader)
    async def list_(
        who: CurrentPrincipal, services: ServicesDep, limit: Limit = 100, cursor: Cursor = None
    ) -> dict[str, Any]:
        return await services.resources.list(kind, limit=limit, cursor=cursor, scope=who.tenant)

    @router.get("/{name}", responses={200: one}, summary=f"Get a {kind.kind}", **reader)
    async def get(name: NamePath, who: CurrentPrincipal, services: ServicesDep) -> JSONResponse:
        view = await services.resources.get(kind, name, who.tenant)
        return JSONResponse(view, headers={"ETag": etag(view["version"])})

    @router.post(
        "", status_code=201, responses={201: created}, summary=f"Create a {kind.kind}", **writer
    )
    async def create(
        who: CurrentPrincipal,
        body: create_body,  # type: ignore[valid-type]
        services: ServicesDep,
    ) -> JSONResponse:
        name = body.name  # type: ignore[attr-defined]
        spec = kind.spec_of(body)
        written = await services.resources.create(kind, name, spec, who.name, who.tenant)
        return written_response(written, 201, f"/v1/{kind.plural}/{written.view['name']}")

    if kind.rotatable:

        @router.post(
            "/{name}/rotate",
            responses={200: created},
            summary=f"Rotate a {kind.kind}'s secret: a new one, shown once; the one before it "
            "keeps working for overlap_s more",
            **writer,
        )
        async def rotate(
            name: NamePath, who: CurrentPrincipal, body: SecretRotation, services: ServicesDep
        ) -> JSONResponse:
            rotated = await services.resources.rotate(
                kind, name, body.overlap_s, who.name, who.tenant
            )
            return written_response(rotated)

    @router.delete("/{name}", status_code=204, summary=f"Delete a {kind.kind}", **writer)
    async def delete(
        name: NamePath,
        who: CurrentPrincipal,
        expected: Checked,
        services: ServicesDep,
        cascade: Annotated[bool, Query(description="delete what depends on it too")] = False,
    ) -> Response:
        revision = await services.resources.delete(
            kind, name, expected, who.name, cascade=cascade, scope=who.tenant
        )
        headers = {"X-Meridian-Revision": str(revision)} if revision is not None else None
        return Response(status_code=204, headers=headers)

    if not kind.updatable:
        return router

    @router.put("/{name}", responses={200: one}, summary=f"Replace a {kind.kind}", **writer)
    async def replace(
        name: NamePath,
        who: CurrentPrincipal,
        expected: Checked,
        body: update_body,  # type: ignore[valid-type]
        services: ServicesDep,
    ) -> JSONResponse:
        given = getattr(body, "name", None)
        if given is not None and given != name:
            raise ValidationFailed(
                "the body names another object",
                [{"field": "body.name", "message": f"is {given!r}, the path says {name!r}"}],
            )
        spec = kind.spec_of(body, kind.update_spec)
        version = body.version  # type: ignore[attr-defined]
        return written_response(
            await services.resources.replace(
                kind, name, spec, expected, who.name, version, who.tenant
            )
        )

    @router.patch(
        "/{name}",
        responses={200: one},
        summary=f"Change fields of a {kind.kind} (JSON merge patch, RFC 7396)",
        **writer,
    )
    async def patch(
        name: NamePath,
        who: CurrentPrincipal,
        expected: Checked,
        body: Annotated[dict[str, Any], Body(description="the fields to change; null removes")],
        services: ServicesDep,
    ) -> JSONResponse:
        patched = await services.resources.patch(kind, name, body, expected, who.name, who.tenant)
        return written_response(patched)

    return router
