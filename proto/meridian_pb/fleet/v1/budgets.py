"""Spend budgets: what a tenant, or one of its API keys, may spend per day or calendar month,
in the fleet's currency, in a time zone the operator chooses. Both planes use this: the
control plane validates a tenant's budgets and puts them in the snapshot (`wire`), and its
leader splits each budget's window over the agents (controlplane/services/quotas/spend.py);
the agents reserve and settle each request's cost against their part (agents/gateway/budgets.py).

A window is named by its first day in the budget's zone (`2026-11-28`, or `2026-11-01` for a
month): both planes derive the same name from the same time. Amounts on the wire are in
billionths of the currency (`nanos`), as costs are (meridian_pb/fleet/v1/prices.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator

from meridian_pb.fleet.v1 import fleet_pb2 as pb

NANOS = 1_000_000_000
MAX_LIMIT = 1_000_000_000.0  # in the currency
PREFIX = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class Period(StrEnum):
    DAY = "day"
    MONTH = "month"


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$", description="unique in the tenant")
    period: Period = Field(description="day, or calendar month")
    time_zone: str = Field(default="UTC", max_length=64,
                           description="an IANA zone: where a window begins")  # fmt: skip
    limit: float = Field(
        ge=1e-6, le=MAX_LIMIT, allow_inf_nan=False,
        description="in the fleet's currency: past it, 429 budget_exceeded",
    )  # fmt: skip
    soft_percent: float = Field(
        default=80.0, ge=1, le=100, allow_inf_nan=False,
        description="at this share of the limit: an audit event, a metric and the webhook",
    )  # fmt: skip
    api_key: str | None = Field(
        default=None, max_length=64,
        description="an API key's prefix: the budget is that key's alone; null: the tenant's",
    )  # fmt: skip
    webhook_url: str | None = Field(
        default=None, max_length=2048, pattern=r"^https?://\S+$",
        description="POSTed once a window when the soft threshold is passed",
    )  # fmt: skip

    @field_validator("time_zone")
    @classmethod
    def _zone(cls, value: str) -> str:
        return zone_name(value)

    @field_validator("api_key")
    @classmethod
    def _prefix(cls, value: str | None) -> str | None:
        if value is not None and not PREFIX.match(value):
            raise ValueError("an API key's prefix, as `meridian keys list` shows it")
        return value

    @field_validator("limit")
    @classmethod
    def _cents(cls, value: float) -> float:
        if abs(round(value * 1e6) - value * 1e6) > 1e-6:
            raise ValueError("a limit has at most six decimal places")
        return value


def zone_name(name: str) -> str:
    """`name` if it is an IANA time zone; else ValueError (a validator's)."""
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"no time zone named {name!r}") from None
    return name


def check(budgets: list[Budget]) -> str | None:
    """Why a tenant's budgets cannot stand together, or None."""
    names = [b.name for b in budgets]
    for name in names:
        if names.count(name) > 1:
            return f"two budgets are named {name!r}"
    return None


def window(period: str, zone: str, at_s: float) -> tuple[str, float, float]:
    """The window holding `at_s` (seconds since the epoch): its name, its start and its end
    (seconds). A day is midnight to midnight in the zone (23 or 25 hours across a change of
    clocks); a month, the first of the month to the first of the next."""
    tz = ZoneInfo(zone)
    local = datetime.fromtimestamp(at_s, UTC).astimezone(tz)
    if period == Period.DAY:
        start = local.replace(hour=0, minute=0, second=0, microsecond=0)
        after = (start + timedelta(days=1, hours=2)).replace(hour=0)
    else:
        start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        after = (start + timedelta(days=32)).replace(day=1)
    start = start.replace(tzinfo=tz)  # the zone's offset on that day (not the instant's)
    after = after.replace(tzinfo=tz)
    return start.date().isoformat(), start.timestamp(), after.timestamp()


def wire(budget: Budget) -> dict[str, Any]:
    """The budget as the snapshot's `BudgetGrant` message's fields (no webhook: the control
    plane alone calls it)."""
    doc: dict[str, Any] = {
        "name": budget.name,
        "period": budget.period.value,
        "time_zone": budget.time_zone,
        "limit_nanos": round(budget.limit * NANOS),
        "soft_percent": budget.soft_percent,
    }
    if budget.api_key is not None:
        doc["api_key"] = budget.api_key
    return doc


@dataclass(frozen=True, slots=True)
class BudgetRule:
    """A budget as an agent holds it: `static_nanos` is this node's static part of the limit
    (the region's part split over its nodes), spent within until the leader leases it more
    or less."""

    name: str
    period: str
    zone: str
    limit_nanos: int
    soft_percent: float
    api_key: str | None
    static_nanos: int

    def applies(self, key: str) -> bool:
        return self.api_key is None or self.api_key == key


def rules(grant: pb.TenantGrant, nodes: int) -> tuple[BudgetRule, ...]:
    """A tenant's budgets from its snapshot's grant, for one of the region's `nodes`."""
    part = grant.spend_share / max(1, nodes)
    return tuple(
        BudgetRule(b.name, b.period, b.time_zone or "UTC", b.limit_nanos, b.soft_percent,
                   b.api_key if b.HasField("api_key") else None, int(b.limit_nanos * part))
        for b in grant.budgets
    )  # fmt: skip
