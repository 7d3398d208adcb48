"""Usage records from an agent's stream, stored once each: inserted by their `id` (and
`started_at`, the partition key) with conflicts ignored, so that a batch sent again after a
lost acknowledgement changes nothing. Each month's partition is made before its first
record, under an advisory lock (replicas may make it at once)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from meridian_pb.fleet.v1 import fleet_pb2 as pb
from sqlalchemy import text
from sqlalchemy.dialects.postgresql import insert

from controlplane.db.engine import Database
from controlplane.db.usage_rows import PARTITIONS_SCHEMA, UsageRecordRow

PARTITION_LOCK = 0x6D657269  # pg_advisory_xact_lock's key for making partitions


def month_of(at: datetime) -> tuple[int, int]:
    return at.year, at.month


def _bounds(month: tuple[int, int]) -> tuple[datetime, datetime]:
    year, number = month
    start = datetime(year, number, 1, tzinfo=UTC)
    end = datetime(year + number // 12, number % 12 + 1, 1, tzinfo=UTC)
    return start, end


def _at(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1e6, UTC)


def row_of(record: pb.UsageRecord, region: str, node: str) -> dict[str, Any]:
    """A record as its row. Its region and node are the agent's that sent it, whatever it
    says: an agent speaks for itself alone."""
    calls = [
        {"model": c.model, "worker": c.worker, "prompt_tokens": c.prompt_tokens,
         "cached_tokens": c.cached_tokens, "completion_tokens": c.completion_tokens}
        for c in record.calls
    ]  # fmt: skip
    return {
        "id": record.id,
        "started_at": _at(record.started_us),
        "ended_at": _at(record.ended_us),
        "request_id": record.request_id,
        "kind": record.kind,
        "tenant": record.tenant,
        "api_key": record.api_key,
        "model": record.model,
        "answered_model": record.answered_model,
        "region": region,
        "node": node,
        "service_class": record.service_class,
        "prompt_tokens": record.prompt_tokens,
        "cached_tokens": record.cached_tokens,
        "completion_tokens": record.completion_tokens,
        "outcome": record.outcome,
        "status": record.status,
        "came_from": record.came_from,
        "escalated_to": record.escalated_to,
        "calls": calls or None,
        "cost_nanos": record.cost_nanos if record.HasField("cost_nanos") else None,
    }


class UsageStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._months: set[tuple[int, int]] = set()  # partitions known to exist

    async def store(self, records: Iterable[pb.UsageRecord], region: str, node: str) -> int:
        """Stores what is new of `records`; returns how many were."""
        rows = [row_of(r, region, node) for r in records if r.id]
        if not rows:
            return 0
        await self._partitions({month_of(r["started_at"]) for r in rows})
        async with self.db.sessions() as session, session.begin():
            stmt = (
                insert(UsageRecordRow)
                .values(rows)
                .on_conflict_do_nothing(
                    index_elements=[UsageRecordRow.id, UsageRecordRow.started_at]
                )
                .returning(UsageRecordRow.id)
            )
            stored = (await session.execute(stmt)).scalars().all()
        return len(stored)

    async def _partitions(self, months: set[tuple[int, int]]) -> None:
        new = months - self._months
        if not new:
            return
        async with self.db.sessions() as session, session.begin():
            await session.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                                  {"key": PARTITION_LOCK})  # fmt: skip
            for month in sorted(new):
                start, end = _bounds(month)
                name = f"usage_records_{month[0]:04d}_{month[1]:02d}"
                await session.execute(text(
                    f"CREATE TABLE IF NOT EXISTS {PARTITIONS_SCHEMA}.{name} PARTITION OF "
                    f"usage_records FOR VALUES FROM ('{start.isoformat()}') "
                    f"TO ('{end.isoformat()}')"
                ))  # fmt: skip
        self._months |= new
