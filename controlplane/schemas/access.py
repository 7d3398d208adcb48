"""Specs of identity and access: tenants, API keys, principals and bootstrap tokens."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Self

from meridian_pb.fleet.v1.budgets import Budget
from meridian_pb.fleet.v1.budgets import check as budgets_clash
from pydantic import Field, StrictBool, model_validator

from controlplane.domain import Role
from controlplane.schemas.classes import ServiceClassName, rank
from controlplane.schemas.common import Meta, Name, Slug, Spec, Unique

DEFAULT_MAX_CONCURRENCY = 256  # a tenant's requests under way at once, unless its spec says


class TenantSpec(Spec):
    tier: Slug = "standard"
    allowed_jurisdictions: Annotated[list[Slug], Unique] | None = Field(
        default=None, max_length=64, description="null: any jurisdiction"
    )
    requests_per_minute: int | None = Field(default=None, ge=1, le=1_000_000_000)
    tokens_per_minute: int | None = Field(default=None, ge=1, le=1_000_000_000_000)
    debug_routes: bool = Field(
        default=False,
        description="its requests may ask, with x-meridian-debug: 1, how they were routed",
    )
    disabled: bool = Field(
        default=False,
        description="its keys are refused (403) in every region, at once (it skips rollouts)",
    )
    tiering: bool = Field(
        default=False,
        description="its requests to a tiered route may go to a cheaper tier (by difficulty "
        "or under load); if not, they get the strongest tier",
    )
    tier_floor: Name | None = Field(
        default=None, description="a model below which its tiered requests never go"
    )
    max_concurrency: int | None = Field(
        default=DEFAULT_MAX_CONCURRENCY,
        ge=1,
        le=1_000_000,
        description="its requests under way at once, fleet-wide (shared by the agents by "
        "demand, as the quotas are); past it, 429 tenant_concurrency. null: no limit",
    )
    weight: float = Field(
        default=1.0,
        ge=0.01,
        le=100.0,
        description="its weight in fair admission: when a model's workers in a region are "
        "saturated, each tenant with requests for it gets slots and queue in proportion",
    )
    default_class: ServiceClassName = Field(
        default=ServiceClassName.STANDARD,
        description="the service class of its requests that name none (service_tier auto or "
        "absent)",
    )
    class_ceiling: ServiceClassName = Field(
        default=ServiceClassName.STANDARD,
        description="the highest class its requests may name; one above it is served at it",
    )
    price_discount_percent: float = Field(
        default=0.0, ge=0, le=100, description="taken off the price of its usage"
    )
    budgets: list[Budget] = Field(
        default_factory=list,
        max_length=32,
        description="what it, or one of its API keys, may spend per day or month (docs/usage.md)",
    )

    @model_validator(mode="after")
    def _default_within_ceiling(self) -> Self:
        why = budgets_clash(self.budgets)
        if why is not None:
            raise ValueError(why)
        if rank(self.default_class) < rank(self.class_ceiling):
            raise ValueError(
                f"default_class {self.default_class.value} is above class_ceiling "
                f"{self.class_ceiling.value}"
            )
        return self


class ApiKeySpec(Spec):
    tenant: Name
    expires_at: datetime | None = None


class ApiKeyUpdate(Spec):
    expires_at: datetime | None = None
    revoked: bool = False


class PrincipalSpec(Spec):
    role: Role
    tenant: Name | None = Field(
        default=None, description="the tenant a tenant-admin administers (and only then)"
    )
    expires_at: datetime | None = Field(
        default=None, description="when its token stops working (a service account's); null: never"
    )

    @model_validator(mode="after")
    def _tenant_of_a_tenant_admin(self) -> Self:
        if (self.role is Role.TENANT_ADMIN) != (self.tenant is not None):
            raise ValueError("a tenant-admin names its tenant, and no other role names one")
        return self


class SecretRotation(Spec):
    overlap_s: int = Field(
        default=3600,
        ge=0,
        le=30 * 86400,
        description="how long the secret before it keeps working beside the new one (never "
        "past its own expiry); 0: it stops at once. A secret from before an earlier rotation "
        "stops now",
    )


class BootstrapTokenSpec(Spec):
    region: Name
    expires_in_s: int = Field(default=3600, ge=60, le=30 * 86400, description="lifetime")
    pool: Name | None = Field(
        default=None,
        description="the node pool of the region whose machines use it: a node it creates "
        "joins that pool (so that the capacity planner counts and sizes it)",
    )


class BootstrapTokenUpdate(Spec):
    revoked: StrictBool = Field(
        default=False,
        description="true: refused from now on (a revoked token stays revoked); agents it "
        "registered keep their own credentials",
    )


class TenantOut(Meta, TenantSpec):
    pass


class ApiKeyOut(Meta):
    tenant: Name
    prefix: str
    expires_at: datetime | None
    revoked: bool
    revoked_at: datetime | None
    previous_expires_at: datetime | None = Field(
        default=None,
        description="when the key's secret before its last rotation stops (or stopped); the "
        "prefix stays the same",
    )


class PrincipalOut(Meta, PrincipalSpec):
    previous_expires_at: datetime | None = Field(
        default=None, description="when the token before its last rotation stops (or stopped)"
    )


class BootstrapTokenOut(Meta):
    region: Name
    expires_at: datetime
    pool: Name | None = None
    revoked: bool = False
    revoked_at: datetime | None = None
