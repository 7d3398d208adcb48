"""Each tenant's spend as the status page shows it: today and this month (UTC), from the
ledger's sums by quarter hour, and each of its budgets' windows as the leader last counted
them (spent and held by the agents, against the limit)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from meridian_pb.fleet.v1.budgets import NANOS
from sqlalchemy import func, select

from controlplane.db.engine import Database
from controlplane.db.quota_rows import QuotaLeaseRow
from controlplane.db.usage_rows import UsageQuarterRow


async def spend_view(db: Database, now: datetime | None = None) -> list[dict[str, Any]]:
    """A row per tenant with spend this month or a budget, by name."""
    now = now or datetime.now(UTC)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    month = day.replace(day=1)
    cost = UsageQuarterRow.cost_nanos
    async with db.sessions() as session:
        sums = await session.execute(
            select(UsageQuarterRow.tenant, func.sum(cost).filter(UsageQuarterRow.at >= day),
                   func.sum(cost))
            .where(UsageQuarterRow.at >= month)
            .group_by(UsageQuarterRow.tenant)
        )  # fmt: skip
        leases = await session.execute(select(QuotaLeaseRow.tenant, QuotaLeaseRow.data))
    out: dict[str, dict[str, Any]] = {}
    for tenant, today, this_month in sums:
        out[tenant] = {"tenant": tenant, "today": float(today or 0) / NANOS,
                       "month": float(this_month or 0) / NANOS, "budgets": []}  # fmt: skip
    for tenant, doc in leases:
        for name, budget in sorted((doc.get("spend") or {}).items()):
            row = out.setdefault(tenant, {"tenant": tenant, "today": 0.0, "month": 0.0,
                                          "budgets": []})  # fmt: skip
            row["budgets"].append({
                "name": name, "window": budget["window"], "limit": budget["limit"] / NANOS,
                "used": budget["used"] / NANOS, "soft": bool(budget["soft"]),
            })  # fmt: skip
    return [out[t] for t in sorted(out)]
