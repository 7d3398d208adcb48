"""A tenant's files (OpenAI's Files API): uploaded for a batch, or made as a batch's output
and errors. The bytes go to the object store first, the record to PostgreSQL after, so a
record never names bytes that are not there; a failed upload leaves at most an orphan
object, never a file a tenant can see.

Who calls is a tenant, by one of its API keys: it sees its own files, never another's (one
it does not own is answered exactly as one that does not exist)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import select

from controlplane.db.access_rows import ApiKeyRow
from controlplane.db.base import utcnow
from controlplane.db.batch_rows import BatchRow, FileRow
from controlplane.db.engine import Database
from controlplane.errors import Forbidden, NotFound, Unauthenticated, ValidationFailed
from controlplane.services.batches.lines import MAX_BYTES, read_lines
from controlplane.services.batches.store import ObjectStore
from controlplane.services.secrets import hash_secret

PURPOSES = ("batch",)  # what a tenant may upload; a batch's own files are "batch_output"
MAX_FILENAME = 255
LIST_LIMIT = 10_000


@dataclass(frozen=True)
class TenantCaller:
    id: int
    name: str


async def tenant_of(db: Database, authorization: str | None) -> TenantCaller:
    """The tenant whose API key is the bearer token: not revoked, not expired, not disabled."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated("send a tenant's API key: Authorization: Bearer <key>")
    async with db.sessions() as session:
        key = (
            await session.execute(select(ApiKeyRow).where(ApiKeyRow.key_hash == hash_secret(token)))
        ).scalar_one_or_none()
    if key is None or key.revoked_at is not None:
        raise Unauthenticated("the API key is not valid")
    if key.expires_at is not None and key.expires_at <= utcnow():
        raise Unauthenticated(f"the API key {key.prefix} has expired")
    if key.tenant.disabled:
        raise Forbidden(f"tenant {key.tenant.name} is disabled")
    return TenantCaller(key.tenant.id, key.tenant.name)


def file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def object_key(tenant: TenantCaller, file: str) -> str:
    return f"files/{tenant.id}/{file}"


def file_doc(row: FileRow) -> dict[str, Any]:
    """The file as OpenAI's API shows it."""
    return {
        "id": row.id,
        "object": "file",
        "bytes": row.bytes,
        "created_at": _unix(row.created_at),
        "filename": row.filename,
        "purpose": row.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


async def upload(
    db: Database,
    store: ObjectStore,
    tenant: TenantCaller,
    filename: str,
    purpose: str,
    data: bytes,
) -> dict[str, Any]:
    """A batch's input file, checked whole (agents/.../lines.py) before it is kept."""
    if purpose not in PURPOSES:
        raise ValidationFailed(
            f"purpose must be one of {', '.join(PURPOSES)}",
            [{"field": "purpose", "message": f"one of {', '.join(PURPOSES)}"}],
        )
    if not filename or len(filename) > MAX_FILENAME or "\x00" in filename:
        raise ValidationFailed(
            "the file needs a name of 1 to 255 characters",
            [{"field": "file", "message": "a name of 1 to 255 characters"}],
        )
    if len(data) > MAX_BYTES:
        raise ValidationFailed(
            f"the file is over {MAX_BYTES} bytes",
            [{"field": "file", "message": f"at most {MAX_BYTES} bytes"}],
        )
    _, problems = read_lines(data)
    if problems:
        raise ValidationFailed(
            f"the file is not a batch's input: {problems[0].message} (line {problems[0].line})",
            [{"field": f"file.line.{p.line}", "message": p.message} for p in problems],
        )
    return file_doc(await keep(db, store, tenant, filename, purpose, data))


async def keep(
    db: Database, store: ObjectStore, tenant: TenantCaller, filename: str, purpose: str,
    data: bytes,
) -> FileRow:  # fmt: skip
    """Bytes in the store, then the record."""
    made = file_id()
    key = object_key(tenant, made)
    await store.put(key, data)
    row = FileRow(id=made, tenant_id=tenant.id, filename=filename, purpose=purpose,
                  bytes=len(data), object_key=key, created_at=utcnow())  # fmt: skip
    async with db.sessions() as session, session.begin():
        session.add(row)
    return row


RowT = TypeVar("RowT", FileRow, BatchRow)


async def owned(db: Database, tenant: TenantCaller, row_type: type[RowT], key: str,
                what: str) -> RowT:  # fmt: skip
    """The tenant's file or batch; NotFound for one that is not there or not its own (a
    tenant cannot tell another's from none)."""
    async with db.sessions() as session:
        row = await session.get(row_type, key)
    if row is None or row.tenant_id != tenant.id:
        raise NotFound(f"no {what} {key!r}")
    return row


async def find_file(db: Database, tenant: TenantCaller, file: str) -> FileRow:
    return await owned(db, tenant, FileRow, file, "file")


async def content(db: Database, store: ObjectStore, tenant: TenantCaller, file: str) -> bytes:
    row = await find_file(db, tenant, file)
    return await store.get(row.object_key)


async def list_files(
    db: Database, tenant: TenantCaller, purpose: str | None, limit: int, after: str | None
) -> dict[str, Any]:
    query = select(FileRow).where(FileRow.tenant_id == tenant.id)
    if purpose is not None:
        query = query.where(FileRow.purpose == purpose)
    if after is not None:
        query = query.where(FileRow.id > after)
    async with db.sessions() as session:
        rows = (await session.execute(query.order_by(FileRow.id).limit(limit + 1))).scalars().all()
    data = [file_doc(r) for r in rows[:limit]]
    return {"object": "list", "data": data, "has_more": len(rows) > limit,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}  # fmt: skip


async def delete_file(
    db: Database, store: ObjectStore, tenant: TenantCaller, file: str
) -> dict[str, Any]:
    """The record first, then the bytes: a file is gone for the tenant once its record is."""
    row = await find_file(db, tenant, file)
    async with db.sessions() as session, session.begin():
        found = await session.get(FileRow, file)
        if found is not None:
            await session.delete(found)
    await store.delete(row.object_key)
    return {"id": file, "object": "file", "deleted": True}


def _unix(at: datetime | None) -> int | None:
    return int(at.timestamp()) if at is not None else None
