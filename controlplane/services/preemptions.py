"""Nodes whose machine is being taken back (a spot preemption notice in their agent's
heartbeat) leave placement at once: the leader sets them draining under a new revision, so
the region's engines are placed on its other nodes, and the capacity planner sizes the pools
for what is left. The agent has drained its engines already (agents/control/preemption.py):
this is the fleet's side of it."""

from __future__ import annotations

import logging

from sqlalchemy import select, update

from controlplane.db.agent_rows import NodeTelemetryRow
from controlplane.db.engine import Database
from controlplane.db.fleet_rows import NodeRow
from controlplane.domain import NodeState
from controlplane.services.placements import commit
from controlplane.services.revisions import RevisionFeed
from controlplane.services.unit import UnitOfWork

log = logging.getLogger(__name__)

ACTOR = "preemption"


class Preemptions:
    def __init__(self, db: Database, feed: RevisionFeed | None = None) -> None:
        self.db = db
        self.feed = feed

    async def tick(self) -> list[str]:
        """The active nodes with a notice, set draining; their names."""
        async with self.db.sessions() as session, session.begin():
            rows = await session.execute(
                select(NodeRow.id, NodeRow.name, NodeRow.state,
                       NodeTelemetryRow.data["preemption"])
                .join(NodeTelemetryRow, NodeTelemetryRow.node_id == NodeRow.id)
                .where(NodeRow.state == NodeState.ACTIVE.value)
                .where(NodeTelemetryRow.data.has_key("preemption"))
                .order_by(NodeRow.id)
                .with_for_update(of=NodeRow)
            )  # fmt: skip
            uow = UnitOfWork(session, ACTOR)
            names, ids = [], []
            for node_id, name, state, notice in rows.all():
                deadline = str((notice or {}).get("deadline", ""))
                source = (notice or {}).get("source", "?")
                why = f"preemption notice ({source}): taken back at {deadline or 'once'}"
                uow.record("update", "node", name, {"state": state},
                           {"state": NodeState.DRAINING.value, "reason": why})  # fmt: skip
                names.append(name)
                ids.append(node_id)
                log.warning("node %s: %s; it leaves placement", name, why)
            if ids:
                await session.execute(
                    update(NodeRow).where(NodeRow.id.in_(ids))
                    .values(state=NodeState.DRAINING.value, version=NodeRow.version + 1)
                )  # fmt: skip
            revision = await commit(uow)
        if self.feed is not None:
            await self.feed.published(revision)
        return names
