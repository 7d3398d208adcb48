"""Who is calling: a bearer token resolved to a principal and its role."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from pydantic import SecretStr
from sqlalchemy import select

from controlplane.db.access_rows import PrincipalRow
from controlplane.db.engine import Database
from controlplane.domain import Role
from controlplane.errors import Forbidden, Unauthenticated
from controlplane.services.secrets import hash_secret

BOOTSTRAP_ADMIN = "bootstrap-admin"


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role

    def require(self, needed: Role) -> None:
        if not self.role.allows(needed):
            raise Forbidden(
                f"{self.name} is a {self.role}; this needs {needed}",
                role=str(self.role),
                needed=str(needed),
            )


class Authenticator:
    def __init__(self, db: Database, admin_token: SecretStr | None) -> None:
        self._db = db
        self._admin_token = admin_token.get_secret_value().encode() if admin_token else None

    async def principal(self, authorization: str | None) -> Principal:
        if not authorization:
            raise Unauthenticated("send Authorization: Bearer <token>")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
        if self._admin_token is not None and hmac.compare_digest(token.encode(), self._admin_token):
            return Principal(BOOTSTRAP_ADMIN, Role.ADMIN)
        async with self._db.sessions() as session:
            row = (
                await session.execute(
                    select(PrincipalRow.name, PrincipalRow.role).where(
                        PrincipalRow.token_hash == hash_secret(token)
                    )
                )
            ).one_or_none()
        if row is None:
            raise Unauthenticated("the token is not valid")
        return Principal(row.name, Role(row.role))
