"""Each tenant's global quota as operators see it: the quota, what the fleet admits of it (in
all and per region), the leases in force, and what was refused, by reason. Rates are per
minute, over the agents' last few seconds."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from controlplane.db.access_rows import TenantRow
from controlplane.db.engine import Database
from controlplane.db.quota_rows import QuotaLeaseRow
from controlplane.errors import NotFound
from controlplane.services.quotas.demand import STALE, NodeDemand, read_demand


async def quotas(db: Database, tenant: str | None = None) -> list[dict[str, Any]]:
    """Every tenant (or the one named, which must exist), by name."""
    now = datetime.now(UTC)
    async with db.sessions() as session:
        query = select(TenantRow).order_by(TenantRow.name)
        if tenant is not None:
            query = query.where(TenantRow.name == tenant)
        tenants = (await session.scalars(query)).all()
        if tenant is not None and not tenants:
            raise NotFound(f"no tenant {tenant!r}")
        demand = await read_demand(session, now - STALE)
        rows = {r.tenant: r for r in (await session.scalars(select(QuotaLeaseRow))).all()}
    return [_view(t, demand, rows.get(t.name)) for t in tenants]


def _view(tenant: TenantRow, demand: dict[str, NodeDemand], row: QuotaLeaseRow | None) -> Any:
    regions: dict[str, dict[str, float]] = {}
    refused: dict[str, float] = {}
    for node in demand.values():
        told = node.tenants.get(tenant.name)
        if told is None:
            continue
        region = regions.setdefault(node.region, {"requests_per_minute": 0.0,
                                                  "tokens_per_minute": 0.0,
                                                  "peak_concurrent": 0.0})  # fmt: skip
        region["requests_per_minute"] += told.admitted_requests
        region["tokens_per_minute"] += told.admitted_tokens
        region["peak_concurrent"] += told.peak_concurrent
        for reason, rate in told.refused_by_reason.items():
            refused[reason] = refused.get(reason, 0.0) + rate
    data = row.data if row is not None else {}
    leases = [{"node": node, **lease} for node, lease in sorted(data.get("leases", {}).items())]
    return {
        "tenant": tenant.name,
        "quota": {"requests_per_minute": tenant.requests_per_minute,
                  "tokens_per_minute": tenant.tokens_per_minute,
                  "concurrent_requests": tenant.max_concurrency},
        "admitted": {
            "requests_per_minute": _round(sum(r["requests_per_minute"] for r in regions.values())),
            "tokens_per_minute": _round(sum(r["tokens_per_minute"] for r in regions.values())),
            "regions": {r: {k: _round(v) for k, v in rates.items()}
                        for r, rates in sorted(regions.items())},
        },
        "refused_per_minute": {"total": _round(sum(refused.values())),
                               "by_reason": {k: _round(v) for k, v in sorted(refused.items())}},
        "leases": leases,
        "reserved": data.get("reserved", {}),
        "leases_updated_at": row.updated_at.isoformat() if row is not None else None,
    }  # fmt: skip


def _round(value: float) -> float:
    return round(value, 1)
