"""What the rollout driver reads of the fleet: nodes of targets, and their heartbeats."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.agent_rows import NodeTelemetryRow, TelemetrySampleRow
from controlplane.db.fleet_rows import NodeRow
from controlplane.services.rollouts.counts import Reading
from controlplane.services.rollouts.judge import NodeView
from controlplane.snapshot import FleetState


def regions_of(state: FleetState, targets: list[str]) -> set[str]:
    out = set()
    for target in targets:
        sort, _, name = target.partition(":")
        if sort == "region":
            out.add(name)
        elif name in state.nodes:
            out.add(state.nodes[name].region)
    return out


def nodes_of(state: FleetState, targets: list[str]) -> list[str]:
    regions = {t.removeprefix("region:") for t in targets if t.startswith("region:")}
    nodes = {t.removeprefix("node:") for t in targets if t.startswith("node:")}
    return sorted(n for n, spec in state.nodes.items() if n in nodes or spec.region in regions)


async def read_nodes(session: AsyncSession, names: list[str]) -> dict[str, Reading]:
    rows = await session.execute(
        select(NodeRow.name, NodeTelemetryRow.data)
        .join(NodeTelemetryRow, NodeTelemetryRow.node_id == NodeRow.id)
        .where(NodeRow.name.in_(names))
    )
    return {name: Reading.from_telemetry(data) for name, data in rows}


async def read_nodes_at(
    session: AsyncSession, names: list[str], at: datetime
) -> dict[str, Reading]:
    """Each node's last sampled heartbeat at or before `at`."""
    newest = (
        select(TelemetrySampleRow.node_id, func.max(TelemetrySampleRow.observed_at).label("at"))
        .where(TelemetrySampleRow.observed_at <= at)
        .group_by(TelemetrySampleRow.node_id)
        .subquery()
    )
    rows = await session.execute(
        select(NodeRow.name, TelemetrySampleRow.data)
        .join(TelemetrySampleRow, TelemetrySampleRow.node_id == NodeRow.id)
        .join(
            newest,
            (newest.c.node_id == TelemetrySampleRow.node_id)
            & (newest.c.at == TelemetrySampleRow.observed_at),
        )
        .where(NodeRow.name.in_(names))
    )
    return {name: Reading.from_telemetry(data) for name, data in rows}


async def node_views(
    session: AsyncSession, names: list[str], readings: dict[str, Reading]
) -> list[NodeView]:
    rows = (await session.execute(select(NodeRow).where(NodeRow.name.in_(names)))).unique()
    return [
        NodeView(
            n.name,
            n.health,
            n.desired_revision,
            n.applied_revision,
            n.last_nack_reason,
            readings.get(n.name),
        )
        for n in rows.scalars()
    ]
