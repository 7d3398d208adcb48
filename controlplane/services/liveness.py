"""The leader's singleton work: mark nodes up or down, and roll telemetry up per region.

Liveness comes from presence (an agent holds a stream to some replica), never from a
timestamp in PostgreSQL; what it concludes is written there so the API can show it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from controlplane.db.agent_rows import (
    ModelQualityRow,
    NodeTelemetryRow,
    RegionLoadRow,
    TelemetrySampleRow,
)
from controlplane.db.engine import Database
from controlplane.db.fleet_rows import NODES, ModelRow, NodeRow, RegionRow
from controlplane.services.planner.core import start_times
from controlplane.services.quality import compare, region_quality
from controlplane.services.rollouts.counts import quantile

log = logging.getLogger(__name__)

UP, DOWN, DEGRADED, UNKNOWN = "up", "down", "degraded", "unknown"


@dataclass
class Sweeper:
    """Marks a node down once no replica has held its agent's stream for `down_after`."""

    db: Database
    down_after: timedelta
    absent_since: dict[str, datetime] = field(default_factory=dict)

    async def sweep(self, present: set[str], now: datetime) -> dict[str, str]:
        """Write the nodes whose health changed; returns them, node -> new health."""
        changed: dict[str, str] = {}
        rows: list[dict[str, Any]] = []
        async with self.db.sessions() as session, session.begin():
            query = select(NodeRow.id, NodeRow.name, NodeRow.health).order_by(NodeRow.id)
            for node_id, name, was in (await session.execute(query)).all():
                health = self._health(name, was, present, now)
                if health is not None and health != was:
                    changed[name] = health
                    rows.append({"node": node_id, "v_health": health, "v_at": now})
            if rows:  # in id order: see NodeReports.flush
                await session.execute(
                    update(NODES)
                    .where(NODES.c.id == bindparam("node"))
                    .values(health=bindparam("v_health"), health_changed_at=bindparam("v_at")),
                    rows,
                )
        for name, health in changed.items():
            log.info("node %s is %s", name, health, extra={"node_id": name})
        return changed

    def _health(self, name: str, was: str, present: set[str], now: datetime) -> str | None:
        if name in present:
            self.absent_since.pop(name, None)
            return UP
        if was != UP:
            return None  # never seen, or already down: nothing new to say
        since = self.absent_since.setdefault(name, now)
        return DOWN if now - since >= self.down_after else None


class NodeHealth(Protocol):
    """What a region's summary reads of a node: a row, or the columns the rollup selects."""

    @property
    def id(self) -> int: ...

    @property
    def health(self) -> str: ...


def region_health(nodes: Sequence[NodeHealth]) -> str:
    states = {n.health for n in nodes}
    if not nodes or states == {UNKNOWN}:
        return UNKNOWN
    if states <= {UP}:
        return UP
    if UP in states:
        return DEGRADED
    return DOWN


def summarize(
    region: str, nodes: Sequence[NodeHealth], latest: dict[int, dict[str, Any]]
) -> dict[str, Any]:
    """A region's capacity and load: sums of its live nodes' latest telemetry."""
    live = [latest[n.id] for n in nodes if n.health == UP and n.id in latest]
    rates = [t.get("prefix_cache_hit_rate", 0.0) for t in live]

    def worst(metric: str, quantile: str) -> float:
        return max((float(t.get(metric, {}).get(quantile, 0.0)) for t in live), default=0.0)

    return {
        "region": region,
        "health": region_health(nodes),
        "nodes_up": sum(1 for n in nodes if n.health == UP),
        "nodes_total": len(nodes),
        "engines_ready": sum(
            1 for t in live for e in t.get("engines", []) if e.get("state") == "ready"
        ),
        "inflight_requests": sum(int(t.get("inflight_requests", 0)) for t in live),
        "queued_requests": sum(int(t.get("queued_requests", 0)) for t in live),
        "prefix_cache_hit_rate": sum(rates) / len(rates) if rates else 0.0,
        "ttft_ms": {q: worst("ttft_ms", q) for q in ("p50", "p90", "p99")},
        "requests_per_second": sum(float(t.get("requests_per_second", 0.0)) for t in live),
        "answers_per_second": sum(
            float(a.get("per_second", 0.0)) for t in live for a in t.get("answers", [])
        ),
        "models": _models(live),
        "escalations": _escalations(live),
        "quality": region_quality(live),
        "tiers": _tiers(live),
        "classes": _classes(live),
        "adapters": _adapters(live),
    }


def _adapters(live: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per LoRA adapter, the region's engines that hold it and its gateways' counts summed:
    requests (a second lately, and in all), the loads requests waited for and their mean
    time, and the loads that failed."""
    sums: dict[str, dict[str, Any]] = {}
    for telemetry in live:
        for a in telemetry.get("adapters", []):
            mine = sums.setdefault(str(a.get("name", "")), {
                "engines": [], "requests_per_second": 0.0, "requests": 0, "cold_loads": 0,
                "cold_load_s": 0.0, "failures": 0,
            })  # fmt: skip
            mine["engines"] += [str(e) for e in a.get("engines", [])]
            for key in ("requests_per_second", "cold_load_s"):
                mine[key] += float(a.get(key, 0.0))
            for key in ("requests", "cold_loads", "failures"):
                mine[key] += int(a.get(key, 0))
    out = []
    for name, a in sorted(sums.items()):
        cold_s = a.pop("cold_load_s")
        mean_ms = round(1000 * cold_s / a["cold_loads"]) if a["cold_loads"] else None
        out.append({"adapter": name, **a, "engines": sorted(a["engines"]),
                    "requests_per_second": round(a["requests_per_second"], 3),
                    "cold_load_ms": mean_ms})  # fmt: skip
    return out


OUTCOMES = ("admitted", "shed", "preempted", "requeued", "escalated", "refused", "past_slo")


def _classes(live: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model and service class, the region's gateways' counts summed since they started:
    requests admitted, shed (for load), preempted, escalated and refused (no worker could
    take them), the times one was requeued (gave its room to a higher class), the admitted
    streams whose first token came past the route's SLO, and the 99th percentile of the
    waits of those admitted."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    waits: dict[tuple[str, str], dict[float, int]] = {}
    for telemetry in live:
        for answers in telemetry.get("answers", []):
            for c in answers.get("classes", []):
                key = (str(answers.get("model", "")), str(c.get("service_class", "")))
                mine = counts.setdefault(key, dict.fromkeys(OUTCOMES, 0))
                for outcome, n in c.get("by_outcome", {}).items():
                    mine[outcome] = mine.get(outcome, 0) + int(n)
                wait = c.get("wait", {})
                buckets = waits.setdefault(key, {})
                for le, n in zip(wait.get("le", []), wait.get("count", []), strict=False):
                    buckets[float(le)] = buckets.get(float(le), 0) + int(n)
    out = []
    for (model, service_class), outcomes in sorted(counts.items(), key=_by_class):
        p99 = quantile(waits.get((model, service_class), {}), 0.99)
        out.append({"model": model, "class": service_class, **outcomes,
                    "wait_p99_s": round(p99, 3) if p99 is not None else None})  # fmt: skip
    return out


def _by_class(item: tuple[tuple[str, str], Any]) -> tuple[str, int]:
    (model, service_class), _ = item
    ranks = {"interactive": 0, "standard": 1, "flex": 2, "batch": 3}
    return model, ranks.get(service_class, 4)


def _tiers(live: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per tiered route, the region's agents' counts summed: the requests each tier answered
    and why, the moves between tiers and why, the cascades by signal."""
    routes: dict[str, dict[str, Any]] = {}
    for telemetry in live:
        for t in telemetry.get("tiers", []):
            route = routes.setdefault(str(t.get("route", "")),
                                      {"answered": {}, "moved": {}, "cascades": {}})  # fmt: skip
            n, kind, why = int(t.get("count", 0)), t.get("kind"), str(t.get("why", ""))
            if kind == "answered":
                key = f"{t.get('model', '')}\t{why}"
                route["answered"][key] = route["answered"].get(key, 0) + n
            elif kind == "moved":
                key = f"{t.get('from_model', '')}\t{t.get('model', '')}\t{why}"
                route["moved"][key] = route["moved"].get(key, 0) + n
            elif kind == "cascade":
                route["cascades"][why] = route["cascades"].get(why, 0) + n
    out = []
    for name, r in sorted(routes.items()):
        answered = [dict(zip(("model", "why"), k.split("\t"), strict=True), count=n)
                    for k, n in sorted(r["answered"].items())]  # fmt: skip
        moved = [dict(zip(("from", "to", "why"), k.split("\t"), strict=True), count=n)
                 for k, n in sorted(r["moved"].items())]  # fmt: skip
        out.append({"route": name, "requests": sum(a["count"] for a in answered),
                    "answered": answered, "moved": moved, "cascades": r["cascades"]})  # fmt: skip
    return out


REFUSING_SHARE = 0.5  # of a model's answers: past it, with engines ready, the model alerts
REFUSING_MIN_RATE = 0.2  # answers a second: below it there is too little to judge


def _models(live: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model, what the region's gateways answered a second lately (refusals and errors
    by their code too), its engines ready and how long they took to start; `alert` when
    most answers are refusals or errors while engines are ready to serve (the fleet looks
    well, and is not)."""
    rates: dict[str, dict[str, float]] = {}
    ready: dict[str, int] = {}
    starts = start_times(e for t in live for e in t.get("engines", []))
    for telemetry in live:
        for answers in telemetry.get("answers", []):
            codes = rates.setdefault(str(answers.get("model", "")), {})
            for code, rate in (answers.get("per_second_by_code") or {}).items():
                codes[code] = codes.get(code, 0.0) + float(rate)
        for engine in telemetry.get("engines", []):
            if engine.get("state") == "ready":
                model = str(engine.get("model", ""))
                ready[model] = ready.get(model, 0) + 1
    out = []
    for model in sorted(set(rates) | set(ready)):
        codes = rates.get(model, {})
        total = sum(codes.values())
        failed = total - codes.get("ok", 0.0)
        share = failed / total if total else 0.0
        refusing = total >= REFUSING_MIN_RATE and share > REFUSING_SHARE and ready.get(model, 0)
        out.append({
            "model": model or None,  # None: requests refused before their model was known
            "answers_per_second": total,
            "by_code": {c: r for c, r in sorted(codes.items(), key=lambda i: -i[1])},
            "failed_share": share,
            "engines_ready": ready.get(model, 0),
            "start_s": starts.get(model),  # its engines' last starts, launch to ready (median)
            "alert": "refusing most requests while its engines are ready" if refusing else None,
        })  # fmt: skip
    return out


def _escalations(live: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Requests escalated out of the region and into it, by peer and reason, summed over its
    nodes (each counts since its agent started)."""
    counts: dict[tuple[str, str, str], int] = {}
    for telemetry in live:
        for c in telemetry.get("escalations", []):
            key = (str(c.get("direction")), str(c.get("peer")), str(c.get("reason")))
            counts[key] = counts.get(key, 0) + int(c.get("count", 0))
    return [
        {"direction": d, "peer": p, "reason": r, "count": n}
        for (d, p, r), n in sorted(counts.items())
    ]


async def rollup(db: Database, now: datetime, keep: timedelta) -> dict[str, dict[str, Any]]:
    """Write every region's load summary, and drop telemetry samples older than `keep`."""
    async with db.sessions() as session, session.begin():
        # columns, not rows: every 5 s, over every node of the fleet
        regions = (await session.execute(select(RegionRow.id, RegionRow.name))).all()
        nodes = (await session.execute(select(NODES.c.id, NODES.c.region_id, NODES.c.health))).all()
        telemetry = select(NodeTelemetryRow.node_id, NodeTelemetryRow.data)
        latest: dict[int, dict[str, Any]] = {n: d for n, d in await session.execute(telemetry)}
        by_region: dict[int, list[Any]] = {}
        for node in nodes:
            by_region.setdefault(node.region_id, []).append(node)
        summaries = {}
        for region in regions:
            doc = summarize(region.name, by_region.get(region.id, []), latest)
            doc["updated_at"] = now.isoformat()
            summaries[region.name] = doc
            stmt = pg_insert(RegionLoadRow).values(
                region_id=region.id, health=doc["health"], updated_at=now, data=doc
            )
            await session.execute(
                stmt.on_conflict_do_update(
                    index_elements=[RegionLoadRow.region_id],
                    set_={"health": doc["health"], "updated_at": now, "data": doc},
                )
            )
        models = {m.name: m.id for m in (await session.execute(select(ModelRow))).scalars()}
        compared = compare({r: doc["quality"] for r, doc in summaries.items()})
        for name, doc in compared.items():
            if name not in models:
                continue  # a model no longer declared, still served somewhere
            stmt = pg_insert(ModelQualityRow).values(model_id=models[name], updated_at=now,
                                                     data=doc)  # fmt: skip
            await session.execute(stmt.on_conflict_do_update(
                index_elements=[ModelQualityRow.model_id], set_={"updated_at": now, "data": doc},
            ))  # fmt: skip
        await session.execute(
            delete(TelemetrySampleRow).where(TelemetrySampleRow.observed_at < now - keep)
        )
    return summaries
