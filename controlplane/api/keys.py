"""Keys: the signing keys of regions and of the control plane (never their secrets), and their
rotation (controlplane/services/sealing/signing.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from meridian_pb.fleet.v1.assertion import CONTROL_PLANE

from controlplane.api.deps import CurrentPrincipal, ServicesDep, allowed
from controlplane.domain import Role
from controlplane.schemas.keys import SigningKeyRotation

router = APIRouter()


@router.get(
    "/v1/signing-keys",
    tags=["keys"],
    summary="Every signing key: whose, its id, its state in a rotation, the KEK it is sealed "
    "under; never the key",
    **allowed(Role.VIEWER),
)
async def signing_keys(services: ServicesDep) -> dict[str, Any]:
    return {"items": await services.keyring.view()}


@router.post(
    "/v1/signing-keys/rotate",
    tags=["keys"],
    summary="Rotate a region's (or the control plane's) signing key: the new key is published "
    "everywhere before it signs, the old one accepted until what it signed has expired",
    **allowed(Role.ADMIN),
)
async def rotate(
    body: SigningKeyRotation, services: ServicesDep, who: CurrentPrincipal
) -> dict[str, Any]:
    owner = CONTROL_PLANE if body.control_plane else str(body.region)
    return await services.keyring.rotate(owner, who.name, immediate=body.immediate)
