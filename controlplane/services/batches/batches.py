"""A tenant's batches (OpenAI's Batch API): made from an input file, stored with every line in
PostgreSQL in one transaction, run by the leader's batch runner (runner.py), and shown as
OpenAI shows them. Cancel stops new lines at once: the lines not yet sent are cancelled in
the same transaction that marks the batch cancelling.

A completion window is any whole number of hours from 1 to 168 (OpenAI takes only `24h`):
lines not answered within it end in the error file as `batch_expired`."""

from __future__ import annotations

import re
import secrets
from datetime import timedelta
from typing import Any

from sqlalchemy import func, insert, select, tuple_, update

from controlplane.db.access_rows import TenantRow
from controlplane.db.base import utcnow
from controlplane.db.batch_rows import BatchLineRow, BatchRow
from controlplane.db.engine import Database
from controlplane.errors import MeridianError, ValidationFailed
from controlplane.services.batches.files import TenantCaller, _unix, find_file, owned
from controlplane.services.batches.lines import read_lines
from controlplane.services.batches.store import ObjectStore

WINDOW = re.compile(r"^([1-9][0-9]{0,2})h$")
MAX_WINDOW_H = 168
MAX_METADATA = 16  # keys, as OpenAI allows
OPEN = ("validating", "in_progress", "finalizing", "cancelling")  # still changing
ENDED = ("completed", "failed", "expired", "cancelled")


class BatchEnded(MeridianError):
    code = "batch_ended"
    status = 409
    title = "The batch has ended"


def batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


def _field(field: str, message: str) -> ValidationFailed:
    return ValidationFailed(f"{field}: {message}", [{"field": field, "message": message}])


def _window_h(window: Any) -> int:
    found = WINDOW.match(window) if isinstance(window, str) else None
    hours = int(found.group(1)) if found else 0
    if not 1 <= hours <= MAX_WINDOW_H:
        raise _field("completion_window", f"a whole number of hours, 1h to {MAX_WINDOW_H}h")
    return hours


def _metadata(metadata: Any) -> dict[str, str] | None:
    if metadata is None:
        return None
    if (
        not isinstance(metadata, dict)
        or len(metadata) > MAX_METADATA
        or not all(isinstance(k, str) and len(k) <= 64 for k in metadata)
        or not all(isinstance(v, str) and len(v) <= 512 for v in metadata.values())
    ):
        raise _field("metadata", f"at most {MAX_METADATA} string keys (64) and values (512)")
    return dict(metadata)


async def create(
    db: Database, store: ObjectStore, tenant: TenantCaller, given: dict[str, Any]
) -> dict[str, Any]:
    """A batch of the tenant's input file: every line must ask `endpoint`."""
    unknown = set(given) - {"input_file_id", "endpoint", "completion_window", "metadata"}
    if unknown:
        raise _field(sorted(unknown)[0], "not a field of a batch")
    endpoint, file = given.get("endpoint"), given.get("input_file_id")
    hours = _window_h(given.get("completion_window"))
    metadata = _metadata(given.get("metadata"))
    if not isinstance(file, str):
        raise _field("input_file_id", "the id of a file uploaded for a batch")
    row = await find_file(db, tenant, file)
    if row.purpose != "batch":
        raise _field("input_file_id", f"file {file} is a batch's {row.purpose}, not an input")
    lines, problems = read_lines(await store.get(row.object_key))
    if problems:  # a file checked at upload; kept as it was: a store that changed it
        raise _field("input_file_id", f"line {problems[0].line}: {problems[0].message}")
    wrong = next((n for n, line in enumerate(lines, 1) if line.url != endpoint), None)
    if wrong is not None:
        raise _field("endpoint", f"line {wrong} asks {lines[wrong - 1].url}, not {endpoint!r}")
    now = utcnow()
    batch = BatchRow(
        id=batch_id(), tenant_id=tenant.id, endpoint=endpoint, input_file_id=file,
        completion_window=f"{hours}h", status="in_progress", total=len(lines), completed=0,
        failed=0, meta=metadata, created_at=now, in_progress_at=now,
        expires_at=now + timedelta(hours=hours),
    )  # fmt: skip
    async with db.sessions() as session, session.begin():
        session.add(batch)
        await session.flush()
        await session.execute(
            insert(BatchLineRow),
            [{"batch_id": batch.id, "line": n, "custom_id": line.custom_id, "model": line.model,
              "body": line.body, "state": "pending", "attempts": 0, "failures": 0}
             for n, line in enumerate(lines)],
        )  # fmt: skip
    return batch_doc(batch)


async def find_batch(db: Database, tenant: TenantCaller, batch: str) -> BatchRow:
    return await owned(db, tenant, BatchRow, batch, "batch")


async def retrieve(db: Database, tenant: TenantCaller, batch: str) -> dict[str, Any]:
    return batch_doc(await find_batch(db, tenant, batch))


async def list_batches(
    db: Database, tenant: TenantCaller, limit: int, after: str | None
) -> dict[str, Any]:
    """Newest first, as OpenAI lists them; `after`: the last id of the page before."""
    query = select(BatchRow).where(BatchRow.tenant_id == tenant.id)
    async with db.sessions() as session:
        if after is not None:
            mark = await session.get(BatchRow, after)
            if mark is None or mark.tenant_id != tenant.id:
                raise _field("after", f"no batch {after!r}")
            query = query.where(
                tuple_(BatchRow.created_at, BatchRow.id) < tuple_(mark.created_at, mark.id)
            )
        order = (BatchRow.created_at.desc(), BatchRow.id.desc())
        rows = (await session.execute(query.order_by(*order).limit(limit + 1))).scalars().all()
    data = [batch_doc(r) for r in rows[:limit]]
    return {"object": "list", "data": data, "has_more": len(rows) > limit,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}  # fmt: skip


async def cancel(db: Database, tenant: TenantCaller, batch: str) -> dict[str, Any]:
    """No line not yet sent is sent again; the batch is cancelled once those under way end."""
    await find_batch(db, tenant, batch)
    async with db.sessions() as session, session.begin():
        row = await session.get(BatchRow, batch, with_for_update=True)
        assert row is not None  # found above; batches are deleted only with their tenant
        if row.status in ENDED or row.status == "cancelling":
            if row.status == "cancelling" or row.status == "cancelled":
                return batch_doc(row)
            raise BatchEnded(f"batch {batch} is {row.status} already: it cannot be cancelled")
        now = utcnow()
        await session.execute(
            update(BatchLineRow)
            .where(BatchLineRow.batch_id == batch, BatchLineRow.state == "pending")
            .values(state="dropped", error="batch_cancelled", answered_at=now)
        )
        running = await session.scalar(
            select(func.count()).where(
                BatchLineRow.batch_id == batch, BatchLineRow.state == "running"
            )
        )
        row.status, row.cancelling_at = "cancelling", now
        if not running:
            row.status, row.cancelled_at = "cancelled", now
    return batch_doc(row)


RECENT = 10  # ended batches the status page shows beside the open ones


async def batches_view(db: Database) -> list[dict[str, Any]]:
    """The status page's: every open batch and the latest that ended, with their tenant,
    counts, and lines pending and running (by region)."""
    async with db.sessions() as session:
        open_rows = (await session.execute(
            select(BatchRow, TenantRow.name).join(TenantRow, TenantRow.id == BatchRow.tenant_id)
            .where(BatchRow.status.in_(OPEN)).order_by(BatchRow.created_at)
        )).all()  # fmt: skip
        ended = (await session.execute(
            select(BatchRow, TenantRow.name).join(TenantRow, TenantRow.id == BatchRow.tenant_id)
            .where(BatchRow.status.in_(ENDED))
            .order_by(BatchRow.created_at.desc()).limit(RECENT)
        )).all()  # fmt: skip
        ids = [b.id for b, _ in open_rows]
        lines = (await session.execute(
            select(BatchLineRow.batch_id, BatchLineRow.state, BatchLineRow.region, func.count())
            .where(BatchLineRow.batch_id.in_(ids),
                   BatchLineRow.state.in_(("pending", "running")))
            .group_by(BatchLineRow.batch_id, BatchLineRow.state, BatchLineRow.region)
        )).all() if ids else []  # fmt: skip
    pending: dict[str, int] = {}
    running: dict[str, dict[str, int]] = {}
    for batch_id, state, region, n in lines:
        if state == "pending":
            pending[batch_id] = pending.get(batch_id, 0) + n
        else:
            running.setdefault(batch_id, {})[str(region)] = n
    out = []
    for row, tenant in [*open_rows, *ended]:
        batch: BatchRow = row
        doc = batch_doc(batch)
        out.append({"id": batch.id, "tenant": tenant, "status": batch.status,
                    **doc["request_counts"], "pending": pending.get(batch.id, 0),
                    "running": running.get(batch.id, {}), "created_at": doc["created_at"],
                    "expires_at": doc["expires_at"]})  # fmt: skip
    return out


def batch_doc(row: BatchRow) -> dict[str, Any]:
    """The batch as OpenAI's API shows it."""
    errors = {"object": "list", "data": row.errors} if row.errors else None
    return {
        "id": row.id,
        "object": "batch",
        "endpoint": row.endpoint,
        "errors": errors,
        "input_file_id": row.input_file_id,
        "completion_window": row.completion_window,
        "status": row.status,
        "output_file_id": row.output_file_id,
        "error_file_id": row.error_file_id,
        "created_at": _unix(row.created_at),
        "in_progress_at": _unix(row.in_progress_at),
        "expires_at": _unix(row.expires_at),
        "finalizing_at": _unix(row.finalizing_at),
        "completed_at": _unix(row.completed_at),
        "failed_at": _unix(row.failed_at),
        "expired_at": _unix(row.expired_at),
        "cancelling_at": _unix(row.cancelling_at),
        "cancelled_at": _unix(row.cancelled_at),
        "request_counts": {"total": row.total, "completed": row.completed, "failed": row.failed},
        "metadata": row.meta,
    }
