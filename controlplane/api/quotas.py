"""Global quotas: each tenant's quota, what the fleet admits of it, its leases, its refusals."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path

from controlplane.api.deps import ServicesDep, allowed
from controlplane.domain import Role
from controlplane.schemas.common import NAME_PATTERN
from controlplane.services.quotas.view import quotas

router = APIRouter()
SUMMARY = (
    "its quota, the rate the fleet admits (in all and per region, per minute over the agents' "
    "last seconds), the leases in force per agent, and the refusals by reason"
)


@router.get("/v1/quotas", tags=["quotas"], summary=f"Every tenant: {SUMMARY}",
            **allowed(Role.VIEWER))  # fmt: skip
async def every_quota(services: ServicesDep) -> dict[str, Any]:
    return {"items": await quotas(services.db), "lease_ttl_s": services.settings.quota_lease_ttl_s}


@router.get("/v1/tenants/{name}/quota", tags=["quotas"], summary=f"One tenant: {SUMMARY}",
            **allowed(Role.VIEWER))  # fmt: skip
async def one_quota(
    services: ServicesDep, name: str = Path(pattern=NAME_PATTERN)
) -> dict[str, Any]:
    return (await quotas(services.db, name))[0]
