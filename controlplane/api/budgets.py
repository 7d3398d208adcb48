"""A tenant's spend budgets, written on their own: what its tenant admin may change of it.

No `from __future__ import annotations` here: FastAPI must see the body type itself.
"""

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from meridian_pb.fleet.v1.budgets import Budget
from pydantic import BaseModel, ConfigDict, Field

from controlplane.api.deps import CurrentPrincipal, ServicesDep, allowed
from controlplane.api.kinds import NamePath, precondition_of, written_response
from controlplane.domain import Role
from controlplane.services.access_kinds import TENANT

router = APIRouter(tags=["tenants"])


class Budgets(BaseModel):
    model_config = ConfigDict(extra="forbid")

    budgets: Annotated[list[Budget], Field(max_length=32)]


@router.put(
    "/v1/tenants/{name}/budgets",
    summary="Replace a tenant's spend budgets (the rest of the tenant unchanged); its tenant "
    "admin may, as an admin may (docs/usage.md)",
    **allowed(Role.ADMIN, tenant_scoped=True),
)
async def put_budgets(
    name: NamePath,
    who: CurrentPrincipal,
    expected: Annotated[set[int] | str, Depends(precondition_of(TENANT))],
    body: Budgets,
    services: ServicesDep,
) -> JSONResponse:
    change = {"budgets": [budget.model_dump(mode="json") for budget in body.budgets]}
    patched = await services.resources.patch(TENANT, name, change, expected, who.name, who.tenant)
    return written_response(patched)
