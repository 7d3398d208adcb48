"""Identity and access kinds: tenants, API keys, principals and bootstrap tokens."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

from controlplane.db.access_rows import ApiKeyRow, BootstrapTokenRow, PrincipalRow, TenantRow
from controlplane.db.base import utcnow
from controlplane.db.fleet_rows import ModelRow, NodePoolRow, RegionRow
from controlplane.domain import Role
from controlplane.errors import ValidationFailed
from controlplane.schemas.access import (
    ApiKeyOut,
    ApiKeySpec,
    ApiKeyUpdate,
    BootstrapTokenOut,
    BootstrapTokenSpec,
    PrincipalOut,
    PrincipalSpec,
    TenantOut,
    TenantSpec,
)
from controlplane.schemas.common import Spec
from controlplane.services.adapter_kind import tenant_users
from controlplane.services.kind import Dependent, Kind
from controlplane.services.secrets import new_secret
from controlplane.services.unit import Doc, UnitOfWork


class TenantKind(Kind[TenantRow]):
    kind, plural, row, spec, out = "tenant", "tenants", TenantRow, TenantSpec, TenantOut
    write_role = Role.ADMIN

    async def assign(self, uow: UnitOfWork, row: TenantRow, spec: Spec) -> None:
        await super().assign(uow, row, spec)
        assert isinstance(spec, TenantSpec)
        row.budgets = [b.model_dump(mode="json") for b in spec.budgets]

    async def validate(self, uow: UnitOfWork, row: TenantRow) -> None:
        if row.tier_floor is not None:
            await uow.ref(ModelRow, "model", row.tier_floor, "tier_floor")

    async def dependents(self, uow: UnitOfWork, row: TenantRow) -> list[Dependent]:
        return [*await super().dependents(uow, row), *await tenant_users(uow, row)]


class ApiKeyKind(Kind[ApiKeyRow]):
    kind, plural, row, spec, out = "api-key", "api-keys", ApiKeyRow, ApiKeySpec, ApiKeyOut
    update_spec = ApiKeyUpdate
    write_role = Role.ADMIN
    name_prefix = "key"
    shown_once = "key"
    server_set = frozenset({"prefix", "revoked_at", "tenant"})  # tenant: fixed once made

    def doc(self, row: ApiKeyRow) -> Doc:
        return {
            "tenant": row.tenant.name,
            "prefix": row.prefix,
            "expires_at": row.expires_at.isoformat() if row.expires_at else None,
            "revoked": row.revoked_at is not None,
            "revoked_at": row.revoked_at.isoformat() if row.revoked_at else None,
        }

    async def assign(self, uow: UnitOfWork, row: ApiKeyRow, spec: Spec) -> None:
        if isinstance(spec, ApiKeySpec):
            row.tenant = await uow.ref(TenantRow, "tenant", spec.tenant, "tenant")
            expires_at = spec.expires_at
        else:
            update = cast(ApiKeyUpdate, spec)
            expires_at = update.expires_at
            if update.revoked and row.revoked_at is None:
                row.revoked_at = utcnow()
            elif not update.revoked and row.revoked_at is not None:
                raise ValidationFailed(
                    "a revoked key stays revoked",
                    [{"field": "revoked", "message": "a revoked key cannot be restored"}],
                )
        if expires_at is not None and expires_at.tzinfo is None:
            raise ValidationFailed(
                "expires_at needs a time zone",
                [{"field": "expires_at", "message": "give a time zone, e.g. 2027-01-01T00:00:00Z"}],
            )
        if expires_at is not None and expires_at != row.expires_at and expires_at <= utcnow():
            raise ValidationFailed(
                "expires_at is in the past",
                [{"field": "expires_at", "message": "must be in the future"}],
            )
        row.expires_at = expires_at

    def mint(self, row: ApiKeyRow) -> Doc:
        secret = new_secret("mk")
        row.prefix, row.key_hash = secret.prefix, secret.digest
        return {"key": secret.value}


class PrincipalKind(Kind[PrincipalRow]):
    kind, plural, row, spec, out = (
        "principal",
        "principals",
        PrincipalRow,
        PrincipalSpec,
        PrincipalOut,
    )
    write_role = Role.ADMIN
    shown_once = "token"

    def mint(self, row: PrincipalRow) -> Doc:
        secret = new_secret("mp")
        row.token_hash = secret.digest
        return {"token": secret.value}


class BootstrapTokenKind(Kind[BootstrapTokenRow]):
    kind, plural, row, spec, out = (
        "bootstrap-token",
        "bootstrap-tokens",
        BootstrapTokenRow,
        BootstrapTokenSpec,
        BootstrapTokenOut,
    )
    updatable = False
    name_prefix = "bt"
    shown_once = "token"

    def doc(self, row: BootstrapTokenRow) -> Doc:
        return {"region": row.region.name, "expires_at": row.expires_at.isoformat(),
                "pool": row.pool.name if row.pool is not None else None}  # fmt: skip

    async def assign(self, uow: UnitOfWork, row: BootstrapTokenRow, spec: Spec) -> None:
        given = cast(BootstrapTokenSpec, spec)
        row.region = await uow.ref(RegionRow, "region", given.region, "region")
        row.expires_at = utcnow() + timedelta(seconds=given.expires_in_s)
        row.pool = None
        if given.pool is not None:
            pool = await uow.ref(NodePoolRow, "node pool", given.pool, "pool")
            if pool.region.name != given.region:
                message = (f"node pool {pool.name!r} is in region {pool.region.name!r}, "
                           f"not {given.region!r}")  # fmt: skip
                raise ValidationFailed(message, [{"field": "pool", "message": message}])
            row.pool = pool

    def mint(self, row: BootstrapTokenRow) -> Doc:
        secret = new_secret("mb")
        row.token_hash = secret.digest
        return {"token": secret.value}


TENANT = TenantKind()
API_KEY = ApiKeyKind()
PRINCIPAL = PrincipalKind()
BOOTSTRAP_TOKEN = BootstrapTokenKind()
