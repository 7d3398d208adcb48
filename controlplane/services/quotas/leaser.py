"""The leader's lease loop: every period, the tenants' leases planned from the fleet's demand
(see `plan`) and written, one row per tenant whose leases changed, each with a new version
from one sequence; the replicas send them on (see controlplane/push/leases.py).

A new leader starts from the leases its predecessor wrote, and counts every agent that holds
one and is not connected as away from now: it keeps their leases aside until they have
surely expired, so a change of leader never gives out a share twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.engine import Database
from controlplane.db.quota_rows import LEASE_VERSION, QuotaLeaseRow
from controlplane.services.fleet_state import FleetReader
from controlplane.services.quotas.demand import STALE, forget_replicas, read_demand
from controlplane.services.quotas.plan import TenantLeases, Timing, plan

log = logging.getLogger(__name__)


def utc_now() -> datetime:
    return datetime.now(UTC)


class Leaser:
    def __init__(
        self, db: Database, timing: Timing, *, clock: Callable[[], datetime] = utc_now
    ) -> None:
        self.db = db
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
        if changed or gone:
            async with self.db.sessions() as session, session.begin():
                await write_leases(session, changed, gone, now)
                await forget_replicas(session, now - STALE * 6)
        self._given = planned


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
