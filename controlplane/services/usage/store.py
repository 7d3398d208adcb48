"""Usage records from an agent's stream, stored once each: copied in (COPY) and inserted by
their `id` (and `started_at`, the partition key) with conflicts ignored, so that a batch
sent again after a lost acknowledgement changes nothing. Each month's partition is made
before its first record, under an advisory lock (replicas may make it at once)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import psycopg
from meridian_pb.fleet.v1 import fleet_pb2 as pb
from psycopg.types.json import Jsonb
from sqlalchemy import text

from controlplane.db.engine import Database
from controlplane.db.usage_rows import PARTITIONS_SCHEMA

PARTITION_LOCK = 0x6D657269  # pg_advisory_xact_lock's key for making partitions
# A batch is copied (COPY, the fastest way in) into a table of the session's own, then moved
# into the ledger in one statement that skips what is there already.
COLUMNS = (
    "id", "started_at", "ended_at", "request_id", "kind", "tenant", "api_key", "model",
    "answered_model", "region", "node", "service_class", "prompt_tokens", "cached_tokens",
    "completion_tokens", "outcome", "status", "came_from", "escalated_to", "calls", "cost_nanos",
    "estimated", "worker",
)  # fmt: skip
NAMES = ", ".join(COLUMNS)
STAGE = (
    "CREATE TEMP TABLE IF NOT EXISTS usage_in (LIKE usage_records INCLUDING DEFAULTS) "
    "ON COMMIT DELETE ROWS"
)
COPY = f"COPY usage_in ({NAMES}) FROM STDIN"
QUARTER = "date_bin('15 minutes', started_at, TIMESTAMPTZ '2000-01-01 00:00:00+00')"
SUMS = ("requests", "refused", "unpriced", "prompt_tokens", "cached_tokens", "completion_tokens",
        "cost_nanos")  # fmt: skip
# ... and each record newly stored added to its quarter hour's sums (usage_quarters), in the same
# statement: a record sent again is in neither. Rows are upserted in key order, so that two
# replicas storing at once take their locks in one order.
MOVE = (  # the columns are this module's constants, never a caller's
    f"WITH moved AS (INSERT INTO usage_records ({NAMES}) SELECT {NAMES} FROM usage_in "  # noqa: S608
    "ON CONFLICT (id, started_at) DO NOTHING RETURNING started_at, kind, tenant, api_key, "
    "model, region, service_class, prompt_tokens, cached_tokens, completion_tokens, "
    "cost_nanos), "
    "summed AS (INSERT INTO usage_quarters (at, tenant, api_key, model, region, service_class, "
    f"{', '.join(SUMS)}) "
    f"SELECT {QUARTER}, tenant, api_key, model, region, "
    "service_class, count(*) FILTER (WHERE kind = 'served'), "
    "count(*) FILTER (WHERE kind = 'refused'), "
    "count(*) FILTER (WHERE kind = 'served' AND cost_nanos IS NULL), sum(prompt_tokens), "
    "sum(cached_tokens), sum(completion_tokens), coalesce(sum(cost_nanos), 0) "
    "FROM moved WHERE kind IN ('served', 'refused') "
    "GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 1, 2, 3, 4, 5, 6 "
    "ON CONFLICT (at, tenant, api_key, model, region, service_class) DO UPDATE SET "
    + ", ".join(f"{s} = usage_quarters.{s} + EXCLUDED.{s}" for s in SUMS)
    + ") SELECT count(*) FROM moved"
)


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
        "estimated": record.estimated,
        "worker": record.worker,
    }


class UsageStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._months: set[tuple[int, int]] = set()  # partitions known to exist

    async def store(self, records: Iterable[pb.UsageRecord], region: str, node: str) -> int:
        """Stores what is new of `records`, in one transaction; returns how many were."""
        rows = [row_of(r, region, node) for r in records if r.id]
        if not rows:
            return 0
        await self._partitions({month_of(r["started_at"]) for r in rows})
        async with self.db.engine.connect() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            assert isinstance(raw, psycopg.AsyncConnection)
            async with raw.transaction(), raw.cursor() as cursor:
                await cursor.execute(STAGE)
                async with cursor.copy(COPY) as copy:
                    for row in rows:
                        await copy.write_row(
                            [Jsonb(row[c]) if c == "calls" and row[c] else row[c] for c in COLUMNS]
                        )
                await cursor.execute(MOVE)
                stored = await cursor.fetchone()
                return int(stored[0]) if stored is not None else 0

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
