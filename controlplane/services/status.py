"""The fleet as the status page shows it: the newest rollout (declared and in force, waves,
checks), regions on their clouds, the revision each runs and who acked it, nodes with their
GPUs and engines, load, escalation flows and recent route receipts. Read in one transaction
from what the agents reported (each node's latest heartbeat, flushed within half a second),
so it is as fresh as the heartbeats, not as the leader's periodic rollup.

Many viewers poll it; `StatusCache` reads the database at most once a second per replica
whatever their number.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from controlplane.db.agent_rows import NodeTelemetryRow
from controlplane.db.audit_rows import AuditEventRow
from controlplane.db.engine import Database
from controlplane.db.fleet_rows import NodeRow, RegionRow
from controlplane.services.batches.batches import batches_view
from controlplane.services.liveness import DEGRADED, UP, summarize
from controlplane.services.planner.loop import read_state as planner_state
from controlplane.services.quality import compare
from controlplane.services.quotas.view import quotas
from controlplane.services.rollouts import control as rollouts
from controlplane.services.unit import current_revision
from controlplane.services.usage.spend import spend_view

RECEIPTS = 25
QUALITY_EVENTS = 10  # the quality guard's latest, from the audit log
STALE = "stale"


async def fleet_status(db: Database, stale_after_s: float = 15.0) -> dict[str, Any]:
    """`stale_after_s`: a node up whose last heartbeat is older shows as stale (the control
    plane closes an agent's stream after that long a silence)."""
    async with db.sessions() as session, session.begin():
        revision = await current_revision(session)
        regions = (await session.execute(select(RegionRow))).unique().scalars().all()
        nodes = (await session.execute(select(NodeRow))).unique().scalars().all()
        telemetry = {
            row.node_id: row for row in (await session.execute(select(NodeTelemetryRow))).scalars()
        }
        judged = (await session.execute(
            select(AuditEventRow).where(AuditEventRow.kind == "worker")
            .order_by(AuditEventRow.id.desc()).limit(QUALITY_EVENTS)
        )).scalars().all()  # fmt: skip
    latest = {node_id: row.data for node_id, row in telemetry.items()}
    out_regions, flows, receipts = [], [], []
    quality = {}
    tiers: list[dict[str, Any]] = []
    classes: list[dict[str, Any]] = []
    adapters: list[dict[str, Any]] = []
    for region in sorted(regions, key=lambda r: r.name):
        mine = sorted((n for n in nodes if n.region_id == region.id), key=lambda n: n.name)
        load = summarize(region.name, mine, latest)
        quality[region.name] = load.pop("quality")
        tiers += [{**t, "region": region.name} for t in load.pop("tiers")]
        classes += [{**c, "region": region.name} for c in load.pop("classes")]
        adapters += [{**a, "region": region.name} for a in load.pop("adapters")]
        for count in load.pop("escalations"):
            if count["direction"] == "out":
                flows.append({"from": region.name, "to": count["peer"],
                              "reason": count["reason"], "count": count["count"]})  # fmt: skip
        pushed = max((n.desired_revision or 0 for n in mine), default=0)
        node_docs = []
        for node in mine:
            beat = telemetry.get(node.id)
            node_docs.append(_node(node, beat, stale_after_s))
            for r in beat.data.get("receipts", []) if beat else []:
                receipts.append({**_receipt(r), "region": region.name, "node": node.name})
        health = load.pop("health")
        if health == UP and any(n["health"] == STALE for n in node_docs):
            health = DEGRADED
        out_regions.append({
            "name": region.name,
            "cloud": region.cloud.name,
            "provider": region.cloud.provider,
            "geography": region.geography,
            "jurisdiction": region.jurisdiction,
            "state": region.state,
            "gateway_url": region.gateway_url,
            "health": health,
            "revision": pushed or None,
            "acked": sum(1 for n in mine if pushed and (n.applied_revision or 0) >= pushed),
            "agents": len(mine),
            "nacks": [{"node": n.name, "reason": n.last_nack_reason}
                      for n in mine if n.last_nack_reason],
            "load": {k: v for k, v in load.items() if k != "region"},
            "nodes": node_docs,
        })  # fmt: skip
    receipts.sort(key=_when, reverse=True)
    return {
        "revision": revision,
        "rollouts": await rollouts.view(db, recent=5),
        "quotas": [q for q in await quotas(db) if any(q["quota"].values())],
        "spend": await spend_view(db),
        "generated_at": datetime.now(UTC).isoformat(),
        "regions": out_regions,
        "flows": flows,
        "receipts": receipts[:RECEIPTS],
        "quality": {
            "models": compare(quality),
            "events": [_judged(e) for e in judged],
        },
        "tiers": tiers,
        "classes": classes,
        "adapters": sorted(adapters, key=lambda a: (a["adapter"], a["region"])),
        "batches": await batches_view(db),
        "planner": await planner_view(db),
    }


async def planner_view(db: Database) -> dict[str, Any]:
    """The capacity planner's last period, as the status page's panel shows it."""
    async with db.sessions() as session:
        row = await planner_state(session)
        return {
            "paused": row.paused,
            "last_run_at": row.last_run_at.isoformat() if row.last_run_at else None,
            "decisions": row.decisions,
        }


def _judged(event: AuditEventRow) -> dict[str, Any]:
    """A quality event as the audit log keeps it: when it was written and by which node."""
    return {"logged_at": event.at.isoformat(), "node": event.principal.removeprefix("node:"),
            **(event.after or {})}  # fmt: skip


def _node(node: NodeRow, beat: NodeTelemetryRow | None, stale_after_s: float) -> dict[str, Any]:
    data = beat.data if beat is not None else {}
    up = node.health == UP
    health = node.health
    if up and (beat is None or _age_s(beat.observed_at) > stale_after_s):
        health = STALE  # its stream is held, but it has not reported in time
    memory = {g.get("index"): g for g in data.get("gpus", [])}
    return {
        "name": node.name,
        "health": health,
        "health_changed_at": node.health_changed_at.isoformat() if node.health_changed_at else None,
        "applied_revision": node.applied_revision,
        "nack": node.last_nack_reason,
        "heartbeat_at": beat.observed_at.isoformat() if beat is not None else None,
        "gpus": [
            {
                "index": g.get("index"),
                "model": g.get("model"),
                "memory_gb": g.get("memory_gb"),
                "used_gb": memory.get(g.get("index"), {}).get("used_gb"),
            }
            for g in node.gpus
        ],
        "engines": [
            {
                "id": e.get("id"),
                "model": e.get("model"),
                # what a node that is down last said is not its state now
                "state": e.get("state") if up else "unknown",
                "inflight": int(e.get("inflight_requests", 0)),
                "queued": int(e.get("queued_requests", 0)),
                "restarts": int(e.get("restarts", 0)),
                "breaker": (e.get("breaker") or None) if up else None,
                "reason": e.get("reason") or None,
            }
            for e in data.get("engines", [])
        ],
    }


def _age_s(at: datetime) -> float:
    return (datetime.now(UTC) - at).total_seconds()


def _when(receipt: dict[str, Any]) -> datetime:
    try:
        return datetime.fromisoformat(str(receipt["at"]))
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)


def _receipt(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "at": r.get("at"),
        "request_id": r.get("request_id"),
        "model": r.get("model"),
        "tenant": r.get("tenant"),
        "status": r.get("status"),
        "served_by": r.get("served_by"),
        "policy": r.get("policy"),
        "reason": r.get("reason"),
        "came_from": r.get("came_from") or None,
        "ttft_ms": r.get("ttft_ms") or None,
        "duration_ms": r.get("duration_ms"),
    }


class StatusCache:
    """The latest status, read again once it is older than `max_age_s`; concurrent callers
    share one read."""

    def __init__(
        self,
        read: Callable[[], Awaitable[dict[str, Any]]],
        max_age_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read, self.max_age_s, self._clock = read, max_age_s, clock
        self._value: dict[str, Any] | None = None
        self._at = float("-inf")
        self._lock = asyncio.Lock()

    async def get(self) -> dict[str, Any]:
        async with self._lock:
            if self._value is None or self._clock() - self._at >= self.max_age_s:
                self._value = await self._read()
                self._at = self._clock()
            return self._value
