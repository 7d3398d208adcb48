"""What the routes depend on: the services, the caller, and the If-Match precondition."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Header, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from controlplane.coord.base import Coordinator
from controlplane.db.engine import Database
from controlplane.domain import Role
from controlplane.services.auth import Authenticator, Principal
from controlplane.services.batches.store import ObjectStore
from controlplane.services.resources import ANY_VERSION, Resources
from controlplane.services.revisions import RevisionFeed
from controlplane.services.sealing.keyring import Keyring
from controlplane.settings import Settings


@dataclass
class Services:
    settings: Settings
    db: Database
    resources: Resources
    auth: Authenticator
    feed: RevisionFeed
    coordinator: Coordinator
    store: ObjectStore  # tenants' files (the Batch API)
    keyring: Keyring  # signing keys, and the sealer of every stored secret


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


# Declares the bearer token in the OpenAPI document; the header is read as it came, so that a
# wrong scheme is told apart from a missing token.
BEARER = HTTPBearer(auto_error=False, description="an admin, operator or viewer token")


async def current_principal(
    request: Request,
    services: ServicesDep,
    _: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)],
) -> Principal:
    return await services.auth.principal(request.headers.get("authorization"))


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]

ROLE_KEY = "x-meridian-role"
SCOPE_KEY = "x-meridian-tenant-scope"


def allowed(
    role: Role, *, tenant_scoped: bool = False, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Route arguments for who may call it: the least role, enforced by a dependency that runs
    before the route's others and before its body is read, and declared in the OpenAPI
    document (`x-meridian-role`), from which the RBAC test takes every operation.
    `tenant_scoped`: a tenant admin may call it too (`x-meridian-tenant-scope`), and the route
    keeps it to its own tenant's objects."""

    async def check(who: CurrentPrincipal) -> None:
        who.require(role, scoped=tenant_scoped)

    scope = {SCOPE_KEY: True} if tenant_scoped else {}
    return {
        "dependencies": [Depends(check)],
        "openapi_extra": {ROLE_KEY: str(role), **scope, **(extra or {})},
    }


def if_match(if_match: Annotated[str | None, Header()] = None) -> set[int] | str | None:
    """The versions If-Match accepts: None when absent, '*' for any, else a set (maybe empty)."""
    if if_match is None:
        return None
    versions: set[int] = set()
    for tag in (part.strip() for part in if_match.split(",")):
        if tag == "*":
            return ANY_VERSION
        if tag.startswith("W/"):
            continue  # a weak tag never matches in If-Match (RFC 9110 13.1.1)
        tag = tag.strip('"')
        if tag.isdigit():
            versions.add(int(tag))
    return versions


IfMatch = Annotated[set[int] | str | None, Depends(if_match)]


def etag(version: int) -> str:
    return f'"{version}"'
