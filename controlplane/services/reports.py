"""What the streams learn of each node, buffered and written to PostgreSQL in batches.

Thousands of agents ack a push within the same second; one UPDATE per ack would make the
database the bottleneck of a push. Facts are merged per node in memory (newest wins) and
flushed by one transaction every `interval_s`. Losing a batch in a crash is harmless: the
agent says its revision again when it reconnects, and heartbeats come every few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from controlplane.db.agent_rows import NodeTelemetryRow, TelemetrySampleRow
from controlplane.db.audit_rows import AuditEventRow
from controlplane.db.engine import Database
from controlplane.db.fleet_rows import NODES
from controlplane.services.unit import current_revision

log = logging.getLogger(__name__)


UNSET: Any = object()


@dataclass
class NodeFacts:
    desired_revision: int | None = None
    applied_revision: int | None = None
    nack_reason: str | None = UNSET  # UNSET: leave as is; None: clear
    telemetry: dict[str, Any] | None = None
    observed_at: datetime | None = None
    quality_events: list[dict[str, Any]] = field(default_factory=list)  # every beat's, in order


@dataclass
class NodeReports:
    db: Database
    interval_s: float = 0.5
    sample_every: timedelta = timedelta(seconds=15)
    _pending: dict[int, NodeFacts] = field(default_factory=dict)
    _last_sample: dict[int, datetime] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None
    _flushed: asyncio.Event = field(default_factory=asyncio.Event)

    def _facts(self, node_id: int) -> NodeFacts:
        return self._pending.setdefault(node_id, NodeFacts())

    def desired(self, node_id: int, revision: int) -> None:
        self._facts(node_id).desired_revision = revision

    def applied(self, node_id: int, revision: int) -> None:
        facts = self._facts(node_id)
        facts.applied_revision = revision
        facts.nack_reason = None

    def nacked(self, node_id: int, revision: int, reason: str) -> None:
        self._facts(node_id).nack_reason = f"revision {revision}: {reason}"[:2000]

    def heartbeat(self, node_id: int, telemetry: dict[str, Any], observed_at: datetime) -> None:
        facts = self._facts(node_id)
        facts.quality_events += telemetry.pop("quality_events", None) or []
        facts.telemetry, facts.observed_at = telemetry, observed_at

    async def flush(self) -> None:
        # Rows are written in node-id order, as every writer of nodes does, so concurrent
        # transactions (the sweeper, registrations) cannot deadlock with this one.
        batch, self._pending = dict(sorted(self._pending.items())), {}
        if not batch:
            return
        try:
            async with self.db.sessions() as session, session.begin():
                # Lock the rows first, in id order; later statements touch them in any order.
                locked = await session.execute(
                    select(NODES.c.id, NODES.c.name)
                    .where(NODES.c.id.in_(list(batch)))
                    .order_by(NODES.c.id)
                    .with_for_update()
                )
                names = {int(row.id): str(row.name) for row in locked}
                await _write_status(session, batch)
                beats = {n: f for n, f in batch.items() if f.telemetry is not None}
                if beats:
                    await self._write_telemetry(session, beats)
                events = [(names[n], e) for n, f in batch.items() if n in names
                          for e in f.quality_events]  # fmt: skip
                if events:
                    await _write_quality_events(session, events)
        except BaseException:
            for node_id, facts in batch.items():  # keep them for the next try; newer win
                newer = self._pending.get(node_id)
                self._pending[node_id] = facts if newer is None else _merge(facts, newer)
            raise

    async def _write_telemetry(self, session: Any, beats: dict[int, NodeFacts]) -> None:
        latest = [
            {"node_id": n, "observed_at": f.observed_at, "data": f.telemetry}
            for n, f in beats.items()
        ]
        # one statement with many parameter sets (not many VALUES): compiled once, cached
        stmt = pg_insert(NodeTelemetryRow)
        await session.execute(
            stmt.on_conflict_do_update(
                index_elements=[NodeTelemetryRow.node_id],
                set_={"observed_at": stmt.excluded.observed_at, "data": stmt.excluded.data},
            ),
            latest,
        )
        await session.execute(
            update(NODES)
            .where(NODES.c.id == bindparam("node"))
            .values(last_heartbeat_at=bindparam("at")),
            [{"node": n, "at": f.observed_at} for n, f in beats.items()],
        )
        samples = []
        for n, f in beats.items():
            if f.observed_at is None:
                continue
            last = self._last_sample.get(n)
            if last is None or f.observed_at - last >= self.sample_every:
                self._last_sample[n] = f.observed_at
                samples.append({"node_id": n, "observed_at": f.observed_at, "data": f.telemetry})
        if samples:
            await session.execute(insert(TelemetrySampleRow), samples)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.flush()
            except Exception:
                log.exception("writing node reports failed; will retry")

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="node-reports")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self.flush()


def _merge(older: NodeFacts, newer: NodeFacts) -> NodeFacts:
    return NodeFacts(
        desired_revision=newer.desired_revision or older.desired_revision,
        applied_revision=newer.applied_revision or older.applied_revision,
        nack_reason=older.nack_reason if newer.nack_reason is UNSET else newer.nack_reason,
        telemetry=newer.telemetry or older.telemetry,
        observed_at=newer.observed_at or older.observed_at,
        quality_events=older.quality_events + newer.quality_events,
    )


async def _write_quality_events(session: Any, events: list[tuple[str, dict[str, Any]]]) -> None:
    """The quality guard's events into the audit log (kind `worker`, named by the worker,
    by the node that saw them), at the revision in force."""
    revision = await current_revision(session)
    await session.execute(insert(AuditEventRow), [
        {"revision": revision, "principal": f"node:{node}"[:63], "action": e.get("kind", "")[:16],
         "kind": "worker", "name": str(e.get("worker", ""))[:63], "before": None, "after": e}
        for node, e in events
    ])  # fmt: skip


async def _write_status(session: Any, batch: dict[int, NodeFacts]) -> None:
    """One executemany per shape of update, so that unset facts are left alone."""
    shapes: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for node_id, f in batch.items():
        values: dict[str, Any] = {}
        if f.desired_revision is not None:
            values["desired_revision"] = f.desired_revision
        if f.applied_revision is not None:
            values["applied_revision"] = f.applied_revision
        if f.nack_reason is not UNSET:
            values["last_nack_reason"] = f.nack_reason
        if values:
            params = {f"v_{column}": value for column, value in values.items()}
            shapes.setdefault(tuple(sorted(values)), []).append({"node": node_id, **params})
    for columns, rows in shapes.items():
        await session.execute(
            update(NODES)
            .where(NODES.c.id == bindparam("node"))
            .values({c: bindparam(f"v_{c}") for c in columns}),
            rows,
        )
