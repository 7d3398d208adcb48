"""What the agents ask for: each replica keeps the newest demand report of every agent that
streams to it, and writes them all as one row every period; the leader reads every replica's
row. One row per replica, not one per agent, so the database sees a few writes a second
however many agents there are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from meridian_pb.fleet.v1.demand import TenantDemand
from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.engine import Database
from controlplane.db.quota_rows import QuotaDemandRow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeDemand:
    node: str
    region: str
    at: datetime
    tenants: dict[str, TenantDemand]


@dataclass
class DemandBook:
    """This replica's agents' newest reports, written as the replica's row every `every_s`."""

    db: Database
    replica: str
    every_s: float = 1.0
    _nodes: dict[str, NodeDemand] = field(default_factory=dict)
    _dirty: bool = False
    _task: asyncio.Task[None] | None = None

    def report(self, demand: NodeDemand) -> None:
        self._nodes[demand.node] = demand
        self._dirty = True

    def gone(self, node: str) -> None:
        """The node's stream ended: its demand is no longer this replica's to tell."""
        if self._nodes.pop(node, None) is not None:
            self._dirty = True

    async def flush(self, now: datetime) -> None:
        data = {n: {"region": d.region, "at": d.at.isoformat(),
                    "tenants": {t: v.as_json() for t, v in d.tenants.items()}}
                for n, d in self._nodes.items()}  # fmt: skip
        async with self.db.sessions() as session, session.begin():
            stmt = pg_insert(QuotaDemandRow).values(replica=self.replica, updated_at=now, data=data)
            await session.execute(
                stmt.on_conflict_do_update(
                    index_elements=[QuotaDemandRow.replica],
                    set_={"updated_at": stmt.excluded.updated_at, "data": stmt.excluded.data},
                )
            )
        self._dirty = False

    async def _run(self, clock: Any) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                # written every period while any agent reports, so its freshness shows
                if self._dirty or self._nodes:
                    await self.flush(clock())
            except Exception:
                log.exception("writing the agents' demand failed; will retry")

    def start(self, clock: Any) -> None:
        self._task = asyncio.create_task(self._run(clock), name="quota-demand")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def read_demand(session: AsyncSession, fresh_after: datetime) -> dict[str, NodeDemand]:
    """Every node's newest report, from the replicas that wrote theirs after `fresh_after`
    (a replica that stopped writing tells nothing any more); the newest report wins."""
    rows = await session.execute(
        select(QuotaDemandRow.data).where(QuotaDemandRow.updated_at > fresh_after)
    )
    nodes: dict[str, NodeDemand] = {}
    for (data,) in rows:
        for node, doc in data.items():
            at = datetime.fromisoformat(doc["at"])
            if node in nodes and nodes[node].at >= at:
                continue
            tenants = {t: TenantDemand.from_json(v) for t, v in doc["tenants"].items()}
            nodes[node] = NodeDemand(node, str(doc["region"]), at, tenants)
    return nodes


async def forget_replicas(session: AsyncSession, before: datetime) -> None:
    """Rows of replicas silent since `before` (stopped or dead)."""
    await session.execute(delete(QuotaDemandRow).where(QuotaDemandRow.updated_at < before))


STALE = timedelta(seconds=10)
