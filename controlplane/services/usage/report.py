"""What the ledger says, summed: tokens, requests and cost per bucket of time (an hour, a day,
a month, in the time zone asked for) and per group (tenant, API key, model, region, class),
shaped as OpenAI's organization usage API answers (a page of buckets, each with its results);
and the raw records of a period, for export."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

import orjson
from meridian_pb.fleet.v1.budgets import zone_name
from pydantic import BaseModel, Field, field_validator, model_validator
from sqlalchemy import ColumnElement, Select, Table, func, literal_column, select, union_all

from controlplane.db.engine import Database
from controlplane.db.usage_rows import UsageQuarterRow, UsageRecordRow

GROUPS = ("tenant", "api_key", "model", "region", "service_class")
Group = Literal["tenant", "api_key", "model", "region", "service_class"]
Width = Literal["1h", "1d", "1mo"]
UNIT = {"1h": "hour", "1d": "day", "1mo": "month"}
MAX_BUCKETS = {"1h": 744, "1d": 400, "1mo": 120}
MAX_FILTER = 100
EPOCH_MAX = 253_402_214_400  # seconds: 9999-12-31, the last day a date may have
LAST = datetime(9999, 12, 1)  # the last bucket a report lists begins before it
TABLE: Table = UsageRecordRow.__table__  # type: ignore[assignment]
QUARTERS: Table = UsageQuarterRow.__table__  # type: ignore[assignment]
QUARTER_S = 900
SUMMED = ("requests", "refused", "unpriced", "input", "cached", "output", "cost")


class UsageQuery(BaseModel):
    """What a usage report asks for. Times are Unix seconds."""

    start_time: int = Field(ge=0, le=EPOCH_MAX, description="from (inclusive), Unix seconds")
    end_time: int | None = Field(default=None, ge=0, le=EPOCH_MAX,
                                 description="until (exclusive); default: now")  # fmt: skip
    bucket_width: Width = "1d"
    time_zone: str = Field(default="UTC", max_length=64,
                           description="where a day and a month begin (IANA name)")  # fmt: skip
    group_by: list[Group] = Field(default_factory=list, max_length=len(GROUPS))
    tenants: list[str] = Field(default_factory=list, max_length=MAX_FILTER)
    api_keys: list[str] = Field(default_factory=list, max_length=MAX_FILTER)
    models: list[str] = Field(default_factory=list, max_length=MAX_FILTER)
    regions: list[str] = Field(default_factory=list, max_length=MAX_FILTER)
    limit: int | None = Field(default=None, ge=1, le=max(MAX_BUCKETS.values()),
                              description="buckets on the page (default: all, up to the width's "
                              "most)")  # fmt: skip
    page: int | None = Field(
        default=None, ge=0, le=EPOCH_MAX, description="the next page's cursor (next_page)"
    )

    @field_validator("time_zone")
    @classmethod
    def _zone(cls, name: str) -> str:
        return zone_name(name)

    @field_validator("tenants", "api_keys", "models", "regions")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not 1 <= len(name) <= 255 or "\x00" in name:
                raise ValueError("each name is 1 to 255 characters")
        return names

    @model_validator(mode="after")
    def _ordered(self) -> UsageQuery:
        if self.end_time is not None and self.end_time <= self.start_time:
            raise ValueError("end_time must be after start_time")
        if len(set(self.group_by)) != len(self.group_by):
            raise ValueError("group_by names a field twice")
        return self


def _bucket_starts(
    start: datetime, end: datetime, width: Width, zone: ZoneInfo, most: int
) -> list[datetime]:
    """The buckets' starts in local time (naive), from the one holding `start` to the one
    holding the instant before `end`: `most` of them at most."""
    local = start.astimezone(zone).replace(tzinfo=None)
    if width == "1h":
        first = local.replace(minute=0, second=0, microsecond=0)
    elif width == "1d":
        first = local.replace(hour=0, minute=0, second=0, microsecond=0)
    else:
        first = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    last = (end - timedelta(microseconds=1)).astimezone(zone).replace(tzinfo=None)
    starts: list[datetime] = []
    at = first
    while at <= last and at < LAST and len(starts) < most:
        starts.append(at)
        at = _next(at, width)
    return starts


def _next(at: datetime, width: Width) -> datetime:
    if width == "1h":
        return at + timedelta(hours=1)
    if width == "1d":
        return at + timedelta(days=1)
    return at.replace(year=at.year + at.month // 12, month=at.month % 12 + 1)


def _unix(local: datetime, zone: ZoneInfo) -> int:
    return int(local.replace(tzinfo=zone).timestamp())


def _filters(
    query: UsageQuery, start: datetime, end: datetime, table: Table = TABLE, at: str = "started_at"
) -> list[ColumnElement[bool]]:
    where = [table.c[at] >= start, table.c[at] < end]
    for field, column in (("tenants", "tenant"), ("api_keys", "api_key"), ("models", "model"),
                          ("regions", "region")):  # fmt: skip
        values = getattr(query, field)
        if values:
            where.append(table.c[column].in_(values))
    return where


def _quarter(at: datetime, up: bool) -> datetime:
    """The quarter hour (UTC) at or after `at` (`up`), or at or before it."""
    seconds = at.timestamp() / QUARTER_S
    whole = math.ceil(seconds) if up else math.floor(seconds)
    return datetime.fromtimestamp(whole * QUARTER_S, UTC)


def _pieces(begin: datetime, stop: datetime, zone: ZoneInfo,
            starts: list[datetime]) -> list[tuple[datetime, datetime, bool]]:  # fmt: skip
    """The period cut where the sums by quarter hour answer as the records would: its whole
    quarter hours, read from the sums, and the parts before and after them, from the records
    (a period that begins at any second reads the records of a quarter hour at most at
    each end). Only in a zone whose offsets are whole quarter hours (every zone's are,
    today); otherwise the records alone. Each piece: (from, until, from the sums)."""
    offsets = (zone.utcoffset(s) for s in starts)
    if not all(o is not None and o.total_seconds() % QUARTER_S == 0 for o in offsets):
        return [(begin, stop, False)]
    low, high = _quarter(begin, up=True), _quarter(stop, up=False)
    if low >= high:
        return [(begin, stop, False)]
    edges = [(begin, low, False), (low, high, True), (high, stop, False)]
    return [(a, b, summed) for a, b, summed in edges if a < b]


def _part(query: UsageQuery, begin: datetime, until: datetime, summed: bool) -> Select[Any]:
    """A piece's sums by bucket and group: from the sums by quarter hour, or the records."""
    unit, zone = UNIT[query.bucket_width], query.time_zone
    # grouped by its name: the expression's parameters would differ in GROUP BY
    bucket: ColumnElement[Any] = literal_column("bucket")
    if summed:
        h = QUARTERS.c
        groups = [h[g] for g in query.group_by]
        return (
            select(
                func.date_trunc(unit, func.timezone(zone, h.at)).label("bucket"), *groups,
                func.sum(h.requests).label("requests"), func.sum(h.refused).label("refused"),
                func.sum(h.unpriced).label("unpriced"), func.sum(h.prompt_tokens).label("input"),
                func.sum(h.cached_tokens).label("cached"),
                func.sum(h.completion_tokens).label("output"),
                func.sum(h.cost_nanos).label("cost"),
            )
            .where(*_filters(query, begin, until, QUARTERS, "at"))
            .group_by(bucket, *groups)
        )  # fmt: skip
    c = TABLE.c
    served = c.kind == "served"
    groups = [c[g] for g in query.group_by]
    return (
        select(
            func.date_trunc(unit, func.timezone(zone, c.started_at)).label("bucket"),
            *groups,
            func.count().filter(served).label("requests"),
            func.count().filter(c.kind == "refused").label("refused"),
            func.count().filter(served & c.cost_nanos.is_(None)).label("unpriced"),
            func.coalesce(func.sum(c.prompt_tokens), 0).label("input"),
            func.coalesce(func.sum(c.cached_tokens), 0).label("cached"),
            func.coalesce(func.sum(c.completion_tokens), 0).label("output"),
            func.coalesce(func.sum(c.cost_nanos), 0).label("cost"),
        )
        .where(*_filters(query, begin, until), c.kind.in_(("served", "refused")))
        .group_by(bucket, *groups)
    )  # fmt: skip


def _sums(query: UsageQuery, pieces: list[tuple[datetime, datetime, bool]]) -> Select[Any]:
    """The period's sums by bucket and group, its pieces' added together."""
    parts = [_part(query, a, b, summed) for a, b, summed in pieces]
    if len(parts) == 1:
        (part,) = parts
        return part.order_by(literal_column("bucket"), *(literal_column(g) for g in query.group_by))
    every = union_all(*parts).subquery()
    keys = [every.c.bucket, *(every.c[g] for g in query.group_by)]
    return (
        select(*keys, *(func.sum(every.c[n]).label(n) for n in SUMMED))
        .group_by(*keys)
        .order_by(*keys)
    )


async def usage_report(db: Database, query: UsageQuery, currency: str) -> dict[str, Any]:
    """A page of buckets, oldest first; `next_page` continues it."""
    zone = ZoneInfo(query.time_zone)
    end = (
        datetime.fromtimestamp(query.end_time, UTC) if query.end_time is not None
        else datetime.now(UTC)
    )  # fmt: skip
    begin = datetime.fromtimestamp(max(query.start_time, query.page or 0), UTC)
    limit = min(query.limit or MAX_BUCKETS[query.bucket_width], MAX_BUCKETS[query.bucket_width])
    starts = _bucket_starts(begin, end, query.bucket_width, zone, limit + 1) if begin < end else []
    page, more = starts[:limit], len(starts) > limit
    if not page:
        return _page([], currency, None)
    bound = datetime.fromtimestamp(_unix(_next(page[-1], query.bucket_width), zone), UTC)
    until = min(end, bound)
    # an end left to now is taken at the page's last bucket's end: no record is later
    stop = until if query.end_time is not None else bound
    statement = _sums(query, _pieces(begin, stop, zone, page))
    async with db.sessions() as session:
        rows = (await session.execute(statement)).mappings().all()
    results: dict[datetime, list[dict[str, Any]]] = {at: [] for at in page}
    for row in rows:
        result: dict[str, Any] = {
            "object": "usage.result",
            "num_model_requests": int(row["requests"]),
            "num_refused_requests": int(row["refused"]),
            "num_unpriced_requests": int(row["unpriced"]),
            "input_tokens": int(row["input"]),
            "input_cached_tokens": int(row["cached"]),
            "output_tokens": int(row["output"]),
            "cost": _amount(int(row["cost"]), currency),
            **{g: row[g] for g in query.group_by},
        }
        results.setdefault(row["bucket"], []).append(result)
    buckets = [
        {"object": "bucket", "start_time": _unix(at, zone),
         "end_time": _unix(_next(at, query.bucket_width), zone), "results": results[at]}
        for at in page
    ]  # fmt: skip
    return _page(buckets, currency, _unix(_next(page[-1], query.bucket_width), zone) if more
                 else None)  # fmt: skip


def _amount(nanos: int, currency: str) -> dict[str, Any]:
    return {"value": nanos / 1e9, "nanos": nanos, "currency": currency}


def _page(buckets: list[dict[str, Any]], currency: str, next_page: int | None) -> dict[str, Any]:
    return {"object": "page", "data": buckets, "currency": currency,
            "has_more": next_page is not None, "next_page": next_page}  # fmt: skip


RECORD_FIELDS = (
    "id", "request_id", "kind", "tenant", "api_key", "model", "answered_model", "region",
    "node", "service_class", "prompt_tokens", "cached_tokens", "completion_tokens",
    "started_at", "ended_at", "outcome", "status", "came_from", "escalated_to", "cost_nanos",
    "estimated",
)  # fmt: skip


async def records(
    db: Database, query: UsageQuery, form: Literal["jsonl", "csv"]
) -> AsyncIterator[bytes]:
    """The raw records of the query's period and filters, oldest first, as JSON lines or CSV
    (a header first); read from the database as they are written out."""
    end = (
        datetime.fromtimestamp(query.end_time, UTC) if query.end_time is not None
        else datetime.now(UTC)
    )  # fmt: skip
    start = datetime.fromtimestamp(query.start_time, UTC)
    statement = (
        select(*(TABLE.c[f] for f in RECORD_FIELDS))
        .where(*_filters(query, start, end), TABLE.c.kind != "meter")
        .order_by(TABLE.c.started_at, TABLE.c.id)
    )
    if form == "csv":
        yield _csv_line(RECORD_FIELDS)
    async with db.sessions() as session:
        result = await session.stream(statement.execution_options(yield_per=1000))
        async for partition in result.mappings().partitions():
            out = []
            for row in partition:
                doc = {k: _plain(v) for k, v in row.items()}
                out.append(orjson.dumps(doc) + b"\n" if form == "jsonl" else
                           _csv_line([doc[k] for k in RECORD_FIELDS]))  # fmt: skip
            yield b"".join(out)


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _csv_line(values: Any) -> bytes:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(["" if v is None else v for v in values])
    return buffer.getvalue().encode()
