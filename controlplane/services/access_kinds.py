"""Identity and access kinds: tenants, API keys, principals and bootstrap tokens."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import cast

from sqlalchemy import Select, select

from controlplane.db.access_rows import ApiKeyRow, BootstrapTokenRow, PrincipalRow, TenantRow
from controlplane.db.base import utcnow
from controlplane.db.fleet_rows import ModelRow, NodePoolRow, RegionRow
from controlplane.domain import Role
from controlplane.errors import Revoked, UnknownReference, ValidationFailed
from controlplane.schemas.access import (
    ApiKeyOut,
    ApiKeySpec,
    ApiKeyUpdate,
    BootstrapTokenOut,
    BootstrapTokenSpec,
    BootstrapTokenUpdate,
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
    tenant_scope = "read"  # its admin reads it (its quotas, classes, budgets)

    def belongs(self, row: TenantRow, tenant: str) -> bool:
        return row.name == tenant

    def owned(self, query: Select[tuple[TenantRow]], tenant: str) -> Select[tuple[TenantRow]]:
        return query.where(TenantRow.name == tenant)

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
    # tenant: fixed once made; prefix: the same across rotations
    server_set = frozenset({"prefix", "revoked_at", "tenant", "previous_expires_at"})
    rotatable = True
    tenant_scope = "write"  # its tenant's admin makes, rotates, revokes and deletes them

    def belongs(self, row: ApiKeyRow, tenant: str) -> bool:
        return row.tenant.name == tenant

    def owned(self, query: Select[tuple[ApiKeyRow]], tenant: str) -> Select[tuple[ApiKeyRow]]:
        return query.where(ApiKeyRow.tenant_id == select(TenantRow.id).where(
            TenantRow.name == tenant).scalar_subquery())  # fmt: skip

    def claim(self, spec: Spec, tenant: str) -> None:
        if isinstance(spec, ApiKeySpec) and spec.tenant != tenant:
            raise UnknownReference("tenant", "tenant", spec.tenant)

    def doc(self, row: ApiKeyRow) -> Doc:
        return {
            "tenant": row.tenant.name,
            "prefix": row.prefix,
            "expires_at": row.expires_at.isoformat() if row.expires_at else None,
            "revoked": row.revoked_at is not None,
            "revoked_at": row.revoked_at.isoformat() if row.revoked_at else None,
            "previous_expires_at": iso(row.previous_expires_at),
        }

    async def assign(self, uow: UnitOfWork, row: ApiKeyRow, spec: Spec) -> None:
        if isinstance(spec, ApiKeySpec):
            row.tenant = await uow.ref(TenantRow, "tenant", spec.tenant, "tenant")
            expires_at = spec.expires_at
        else:
            update = cast(ApiKeyUpdate, spec)
            expires_at = update.expires_at
            row.revoked_at = revoked_at(row.revoked_at, update.revoked, "key")
        row.expires_at = checked_expiry(expires_at, row.expires_at)

    def mint(self, row: ApiKeyRow) -> Doc:
        secret = new_secret("mk", getattr(row, "prefix", None))  # a rotation keeps the prefix
        row.prefix, row.key_hash = secret.prefix, secret.digest
        return {"key": secret.value}

    def rotated(self, row: ApiKeyRow, overlap_s: int) -> Doc:
        if row.revoked_at is not None:
            raise Revoked(f"API key {row.name!r} is revoked: make a new one", name=row.name)
        until = overlap_until(overlap_s, row.expires_at)
        previous = row.key_hash if until is not None else None
        secret = self.mint(row)
        row.previous_key_hash, row.previous_expires_at = previous, until
        return secret


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
    server_set = frozenset({"previous_expires_at"})
    rotatable = True

    def doc(self, row: PrincipalRow) -> Doc:
        return {"role": row.role, "tenant": row.tenant.name if row.tenant is not None else None,
                "expires_at": iso(row.expires_at),
                "previous_expires_at": iso(row.previous_expires_at)}  # fmt: skip

    async def assign(self, uow: UnitOfWork, row: PrincipalRow, spec: Spec) -> None:
        given = cast(PrincipalSpec, spec)
        row.role = given.role
        row.tenant = None
        if given.tenant is not None:
            row.tenant = await uow.ref(TenantRow, "tenant", given.tenant, "tenant")
        row.expires_at = checked_expiry(given.expires_at, row.expires_at)

    def mint(self, row: PrincipalRow) -> Doc:
        secret = new_secret("mp")
        row.token_hash = secret.digest
        return {"token": secret.value}

    def rotated(self, row: PrincipalRow, overlap_s: int) -> Doc:
        until = overlap_until(overlap_s, row.expires_at)
        previous = row.token_hash if until is not None else None
        secret = self.mint(row)
        row.previous_token_hash, row.previous_expires_at = previous, until
        return secret


class BootstrapTokenKind(Kind[BootstrapTokenRow]):
    kind, plural, row, spec, out = (
        "bootstrap-token",
        "bootstrap-tokens",
        BootstrapTokenRow,
        BootstrapTokenSpec,
        BootstrapTokenOut,
    )
    update_spec = BootstrapTokenUpdate
    name_prefix = "bt"
    shown_once = "token"
    server_set = frozenset({"region", "expires_at", "pool", "revoked_at"})

    def doc(self, row: BootstrapTokenRow) -> Doc:
        return {
            "region": row.region.name,
            "expires_at": row.expires_at.isoformat(),
            "pool": row.pool.name if row.pool is not None else None,
            "revoked": row.revoked_at is not None,
            "revoked_at": iso(row.revoked_at),
        }

    async def assign(self, uow: UnitOfWork, row: BootstrapTokenRow, spec: Spec) -> None:
        if isinstance(spec, BootstrapTokenUpdate):
            row.revoked_at = revoked_at(row.revoked_at, spec.revoked, "token")
            return
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


def iso(when: datetime | None) -> str | None:
    return when.isoformat() if when is not None else None


def revoked_at(was: datetime | None, revoked: bool, what: str) -> datetime | None:
    """When a key or token was revoked, as a write asks: now, if it asks and it was not yet;
    a revocation is never undone."""
    if revoked and was is None:
        return utcnow()
    if not revoked and was is not None:
        raise ValidationFailed(
            f"a revoked {what} stays revoked",
            [{"field": "revoked", "message": f"a revoked {what} cannot be restored"}],
        )
    return was


def overlap_until(overlap_s: int, expires_at: datetime | None) -> datetime | None:
    """Until when a rotated secret keeps working: `overlap_s` from now, never past the
    secret's own expiry; None for none at all."""
    if overlap_s <= 0:
        return None
    until = utcnow() + timedelta(seconds=overlap_s)
    return min(until, expires_at) if expires_at is not None else until


def checked_expiry(expires_at: datetime | None, current: datetime | None) -> datetime | None:
    """An expiry as given, if it has a time zone and, when it changes, lies ahead."""
    if expires_at is not None and expires_at.tzinfo is None:
        raise ValidationFailed(
            "expires_at needs a time zone",
            [{"field": "expires_at", "message": "give a time zone, e.g. 2027-01-01T00:00:00Z"}],
        )
    if expires_at is not None and expires_at != current and expires_at <= utcnow():
        raise ValidationFailed(
            "expires_at is in the past",
            [{"field": "expires_at", "message": "must be in the future"}],
        )
    return expires_at


TENANT = TenantKind()
API_KEY = ApiKeyKind()
PRINCIPAL = PrincipalKind()
BOOTSTRAP_TOKEN = BootstrapTokenKind()
