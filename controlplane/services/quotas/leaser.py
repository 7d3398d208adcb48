"""The leader's lease loop: every period, the tenants' leases planned from the fleet's demand
(see `plan`) and written, one row per tenant whose leases changed, each with a new version
from one sequence; the replicas send them on (see controlplane/push/leases.py).

A new leader starts from the leases its predecessor wrote, and counts every agent that holds
one and is not connected as away from now: it keeps their leases aside until they have
surely expired, so a change of leader never gives out a share twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from meridian_pb.fleet.v1.budgets import NANOS
from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.audit_rows import AuditEventRow
from controlplane.db.engine import Database
from controlplane.db.quota_rows import LEASE_VERSION, QuotaLeaseRow
from controlplane.services.fleet_state import FleetReader
from controlplane.services.quotas.demand import STALE, forget_replicas, read_demand
from controlplane.services.quotas.plan import TenantLeases, Timing, plan
from controlplane.services.unit import current_revision
from controlplane.snapshot import FleetState

log = logging.getLogger(__name__)
ACTOR = "system:budgets"
WEBHOOK_TIMEOUT_S = 5.0


def utc_now() -> datetime:
    return datetime.now(UTC)


class Leaser:
    def __init__(
        self,
        db: Database,
        timing: Timing,
        *,
        clock: Callable[[], datetime] = utc_now,
        observe: Observe | None = None,
    ) -> None:
        self.db = db
        self.observe = observe  # each budget's part spent, and its soft threshold passed
        self._hooks: set[asyncio.Task[None]] = set()
        self.timing = timing
        self.clock = clock
        self._given: dict[str, TenantLeases] | None = None  # as written; None: not leading
        self._away: dict[str, datetime] = {}  # node -> when this leader saw it not connected
        self._fleet = FleetReader()  # every second: read again only what changed

    def resign(self) -> None:
        """No longer the leader: what it knew is stale by the time it leads again."""
        self._given, self._away = None, {}

    async def tick(self, connected: set[str]) -> None:
        now = self.clock()
        async with self.db.sessions() as session, session.begin():
            await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            state = await self._fleet.read(session)
            demand = await read_demand(session, now - STALE)
            if self._given is None:
                self._given = await read_leases(session)
                self._away = {n: now for t in self._given.values() for n in t["leases"]}
        for node in connected:
            self._away.pop(node, None)
        for doc in self._given.values():
            for node in doc["leases"]:
                if node not in connected:
                    self._away.setdefault(node, now)
        self._away = {n: t for n, t in self._away.items()
                      if now - t < timedelta(seconds=self.timing.forget_s)}  # fmt: skip
        planned = plan(state, demand, connected, self._given, self._away, now, self.timing)
        changed = {t: d for t, d in planned.items() if self._given.get(t) != d}
        gone = [t for t in self._given if t not in planned]
        alerts = soft_passed(self._given, planned)
        if changed or gone:
            async with self.db.sessions() as session, session.begin():
                await write_leases(session, changed, gone, now)
                await forget_replicas(session, now - STALE * 6)
                await audit_alerts(session, alerts)
        self._given = planned
        self._alert(state, planned, alerts)

    def _alert(self, state: FleetState, planned: dict[str, TenantLeases], alerts: Alerts) -> None:
        """The budgets' metrics; a webhook for each soft threshold just passed (audited with
        the leases that saw it), called apart: a slow one never holds the loop's period."""
        for tenant, doc in planned.items():
            for name, spend in doc.get("spend", {}).items():
                if self.observe is not None:
                    self.observe(tenant, name, spend["used"] / spend["limit"],
                                 (tenant, name) in alerts)  # fmt: skip
        for (tenant, name), detail in alerts.items():
            spec = state.tenants.get(tenant)
            url = (
                next((b.webhook_url for b in spec.budgets if b.name == name), None)
                if spec
                else None
            )
            if url:
                task = asyncio.create_task(call_webhook(url, tenant, detail))
                self._hooks.add(task)
                task.add_done_callback(self._hooks.discard)


Alerts = dict[tuple[str, str], dict[str, Any]]  # (tenant, budget): what the alert says
Observe = Callable[[str, str, float, bool], None]


def soft_passed(given: dict[str, TenantLeases], planned: dict[str, TenantLeases]) -> Alerts:
    """The budgets whose soft threshold was passed since the last period (once a window)."""
    out: Alerts = {}
    for tenant, doc in planned.items():
        for name, spend in doc.get("spend", {}).items():
            was = given.get(tenant, {}).get("spend", {}).get(name, {})
            if spend["soft"] and not (was.get("soft") and was.get("window") == spend["window"]):
                out[tenant, name] = {"tenant": tenant, "budget": name, "window": spend["window"],
                                     "spent": spend["used"] / NANOS,
                                     "limit": spend["limit"] / NANOS}  # fmt: skip
    return out


async def audit_alerts(session: AsyncSession, alerts: Alerts) -> None:
    if not alerts:
        return
    revision = await current_revision(session)
    for (tenant, _), detail in sorted(alerts.items()):
        session.add(AuditEventRow(revision=revision, principal=ACTOR, kind="tenant", name=tenant,
                                  action="budget.soft", after=detail))  # fmt: skip


async def call_webhook(url: str, tenant: str, detail: dict[str, Any]) -> None:
    """POST the alert (JSON) once; a failure is logged, not retried."""
    try:
        async with httpx.AsyncClient(timeout=WEBHOOK_TIMEOUT_S) as client:
            answer = await client.post(url, json={"type": "budget.soft_threshold", **detail})
        if answer.status_code >= 400:
            log.warning("tenant %s's budget webhook answered %s", tenant, answer.status_code)
    except httpx.HTTPError as error:
        log.warning("tenant %s's budget webhook failed: %s", tenant, error)


async def read_leases(session: AsyncSession) -> dict[str, TenantLeases]:
    rows = await session.execute(select(QuotaLeaseRow.tenant, QuotaLeaseRow.data))
    return {tenant: dict(data) for tenant, data in rows}


async def write_leases(
    session: AsyncSession, changed: dict[str, TenantLeases], gone: list[str], now: datetime
) -> None:
    if gone:
        await session.execute(delete(QuotaLeaseRow).where(QuotaLeaseRow.tenant.in_(gone)))
    for tenant, doc in sorted(changed.items()):
        stmt = pg_insert(QuotaLeaseRow).values(
            tenant=tenant, version=LEASE_VERSION.next_value(), updated_at=now, data=doc
        )
        await session.execute(
            stmt.on_conflict_do_update(
                index_elements=[QuotaLeaseRow.tenant],
                set_={"version": stmt.excluded.version, "updated_at": now, "data": doc},
            )
        )
