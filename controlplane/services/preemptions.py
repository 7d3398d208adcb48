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


async def set_states(
    uow: UnitOfWork, nodes: dict[int, tuple[str, str, str]], to: NodeState
) -> None:
    """Nodes (id: name, state now, why) set to a state, each change audited with its reason;
    committed with the unit of work. The caller has locked their rows."""
    for name, state, why in nodes.values():
        uow.record("update", "node", name, {"state": state}, {"state": to.value, "reason": why})
    if nodes:
        await uow.session.execute(
            update(NodeRow).where(NodeRow.id.in_(list(nodes)))
            .values(state=to.value, version=NodeRow.version + 1)
        )  # fmt: skip


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
            leaving: dict[int, tuple[str, str, str]] = {}
            for node_id, name, state, notice in rows.all():
                deadline = str((notice or {}).get("deadline", ""))
                source = (notice or {}).get("source", "?")
                why = f"preemption notice ({source}): taken back at {deadline or 'once'}"
                leaving[node_id] = (name, state, why)
                log.warning("node %s: %s; it leaves placement", name, why)
            await set_states(uow, leaving, NodeState.DRAINING)
            revision = await commit(uow)
        names = [name for name, _, _ in leaving.values()]
        if self.feed is not None:
            await self.feed.published(revision)
        return names
