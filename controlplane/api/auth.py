"""How people sign in: the identity provider a client should send them to, and who they are."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from controlplane.api.deps import CurrentPrincipal, ServicesDep, allowed
from controlplane.domain import Role

router = APIRouter(tags=["access"])


@router.get(
    "/v1/auth/config",
    summary="The OpenID Connect provider people sign in through (public: the CLI's "
    "`meridian login` and the status page read it before anyone is signed in); `oidc` is "
    "null when only tokens are taken",
)
async def auth_config(services: ServicesDep) -> dict[str, Any]:
    oidc = services.auth.oidc
    return {"oidc": await oidc.public() if oidc is not None else None}


@router.get(
    "/v1/auth/whoami",
    summary="The caller as the control plane sees it: name, role and, for a tenant admin, "
    "its tenant",
    **allowed(Role.VIEWER, tenant_scoped=True),
)
async def whoami(who: CurrentPrincipal) -> dict[str, Any]:
    return {"name": who.name, "role": str(who.role), "tenant": who.tenant}
