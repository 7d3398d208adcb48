"""Domain vocabulary shared by the API schemas, the services and the snapshot compiler."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    """Viewer, operator and admin, each allowed what the one before is; and tenant-admin,
    bound to one tenant, allowed only the operations scoped to a tenant (its API keys, its
    tenant read, its usage), and only on its own tenant's objects."""

    TENANT_ADMIN = "tenant-admin"
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return _RANKS[self]

    def allows(self, needed: Role) -> bool:
        return self.rank >= needed.rank


_RANKS = {Role.TENANT_ADMIN: -1, Role.VIEWER: 0, Role.OPERATOR: 1, Role.ADMIN: 2}
_TENANT = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class RoleGrant:
    """What an identity provider's group grants: a role, and for a tenant admin its tenant."""

    role: Role
    tenant: str | None = None

    @classmethod
    def parse(cls, text: str) -> RoleGrant:
        """`viewer`, `operator`, `admin` or `tenant-admin:<tenant>`; ValueError otherwise."""
        role, _, tenant = text.strip().partition(":")
        if role == Role.TENANT_ADMIN:
            if not _TENANT.match(tenant):
                raise ValueError(f"{text!r}: tenant-admin names its tenant: tenant-admin:<tenant>")
            return cls(Role.TENANT_ADMIN, tenant)
        if role not in {Role.VIEWER, Role.OPERATOR, Role.ADMIN} or tenant:
            raise ValueError(
                f"{text!r} is not a role: viewer, operator, admin or tenant-admin:<tenant>"
            )
        return cls(Role(role))


class RegionState(StrEnum):
    ACTIVE = "active"
    DRAINING = "draining"
    DISABLED = "disabled"


class NodeState(StrEnum):
    ACTIVE = "active"
    DRAINING = "draining"
    DISABLED = "disabled"


class EngineBackend(StrEnum):
    SGLANG = "sglang"
    SIM = "sim"
    EXTERNAL = "external"


class PdMode(StrEnum):
    UNIFIED = "unified"
    DISAGGREGATED = "disaggregated"


class PlannerMode(StrEnum):
    OFF = "off"
    ADVISE = "advise"  # plans and audits; changes nothing
    ACT = "act"


class RoutingPolicyName(StrEnum):
    COST = "cost"
    ROUND_ROBIN = "round_robin"
    LEAST_LOAD = "least_load"
    POWER_OF_TWO = "power_of_two"
    CACHE_AWARE = "cache_aware"


class FallbackTrigger(StrEnum):
    OVERLOAD = "overload"
    FAILURE = "failure"


class CascadeSignal(StrEnum):
    """What makes a cheap tier's answer be asked again of the strongest (tiered routes)."""

    INVALID_JSON = "invalid_json"
    TOOL_SCHEMA = "tool_schema"
    LENGTH = "length"
    LOW_LOGPROB = "low_logprob"


class Capability(StrEnum):
    CHAT = "chat"
    COMPLETION = "completion"
    EMBEDDING = "embedding"
    TOOLS = "tools"
    VISION = "vision"
