"""Who is calling: a bearer token resolved to a principal and its role."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from pydantic import SecretStr
from sqlalchemy import select

from controlplane.db.access_rows import PrincipalRow, TenantRow
from controlplane.db.base import utcnow
from controlplane.db.engine import Database
from controlplane.domain import Role
from controlplane.errors import Forbidden, Unauthenticated
from controlplane.services.oidc import OidcVerifier
from controlplane.services.secrets import hash_secret

BOOTSTRAP_ADMIN = "bootstrap-admin"


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role
    tenant: str | None = None  # a tenant admin's: all it may see and change

    def require(self, needed: Role, *, scoped: bool = False) -> None:
        """Allowed `needed`: by rank; a tenant admin, only where the operation is scoped to
        a tenant (the operation then keeps it to its own tenant's objects)."""
        if self.tenant is not None and scoped:
            return
        if not self.role.allows(needed):
            raise Forbidden(
                f"{self.name} is a {self.role}; this needs {needed}",
                role=str(self.role),
                needed=str(needed),
            )


class Authenticator:
    """A bearer token is the bootstrap admin token, a principal's token (a service account,
    stored hashed), or, when an identity provider is configured, a person's ID token (a JWT,
    checked by `oidc`)."""

    def __init__(
        self, db: Database, admin_token: SecretStr | None, oidc: OidcVerifier | None = None
    ) -> None:
        self._db = db
        self._admin_token = admin_token.get_secret_value().encode() if admin_token else None
        self.oidc = oidc

    async def principal(self, authorization: str | None) -> Principal:
        if not authorization:
            raise Unauthenticated("send Authorization: Bearer <token>")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
        if self._admin_token is not None and hmac.compare_digest(token.encode(), self._admin_token):
            return Principal(BOOTSTRAP_ADMIN, Role.ADMIN)
        if self.oidc is not None and token.count(".") == 2:  # a JWT; Meridian's have one dot
            name, grant = await self.oidc.principal(token)
            return Principal(name, grant.role, grant.tenant)
        digest, now = hash_secret(token), utcnow()
        async with self._db.sessions() as session:
            row = (await session.execute(
                select(PrincipalRow.name, PrincipalRow.role, PrincipalRow.expires_at,
                       TenantRow.name.label("tenant"))
                .outerjoin(TenantRow, TenantRow.id == PrincipalRow.tenant_id).where(
                    (PrincipalRow.token_hash == digest)
                    | ((PrincipalRow.previous_token_hash == digest)
                       & (PrincipalRow.previous_expires_at > now))
                )
            )).one_or_none()  # fmt: skip
        if row is None:
            raise Unauthenticated("the token is not valid")
        if row.expires_at is not None and row.expires_at <= now:
            raise Unauthenticated(f"the token of {row.name} has expired")
        return Principal(row.name, Role(row.role), row.tenant)
