"""Who is calling: a tenant's API key checked against the snapshot's hashes, with expiry and
the tenant's jurisdictions; never a call to the control plane."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable

from agents.config import RegionConfig, Tenant
from agents.gateway.errors import Forbidden, Unauthenticated
from agents.gateway.flight import OPERATOR


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def authenticate(
    header: str | None, config: RegionConfig, clock: Callable[[], float] = time.time
) -> tuple[Tenant, str]:
    """The tenant a key names, and the key's hash (what a caller's private memory is keyed
    by: a tiered conversation's, say)."""
    token = bearer(header)
    if token is None:
        raise Unauthenticated("an API key is required: Authorization: Bearer <key>")
    hashed = hashlib.sha256(token.encode()).hexdigest()
    key = config.keys.get(hashed)
    if key is None:
        raise Unauthenticated("the API key is not valid in this region")
    if key.expires_at is not None and key.expires_at <= clock():
        raise Unauthenticated(f"the API key {key.prefix} has expired")
    return admissible(key.tenant, config), hashed


def admissible(tenant: Tenant, config: RegionConfig) -> Tenant:
    """The tenant, if it may be served here: not disabled, and within its jurisdictions."""
    if tenant.disabled:
        raise Forbidden(f"tenant {tenant.name} is disabled")
    if tenant.jurisdictions is not None and config.jurisdiction not in tenant.jurisdictions:
        raise Forbidden(
            f"tenant {tenant.name} may not be served in jurisdiction {config.jurisdiction}"
        )
    return tenant


def caller(
    header: str | None, config: RegionConfig, operator_token: str | None
) -> tuple[Tenant, bool, str]:
    """The tenant a key names (or the operator, by its token), whether it may see the
    fleet's inside, and its scope: its key's hash (the operator's: "operator")."""
    if operator_token and same_secret(bearer(header), operator_token):
        return OPERATOR, True, "operator"
    tenant, hashed = authenticate(header, config)
    return tenant, tenant.debug_routes, hashed


def same_secret(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())
