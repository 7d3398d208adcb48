"""Reading the audit log and the revision."""

from __future__ import annotations

from sqlalchemy import select

from controlplane.db.audit_rows import AuditEventRow
from controlplane.db.engine import Database
from controlplane.errors import MalformedBody
from controlplane.services.unit import Doc, current_revision


async def revision(db: Database) -> int:
    async with db.sessions() as session:
        return await current_revision(session)


async def audit_events(
    db: Database, *, limit: int, cursor: str | None, kind: str | None, name: str | None
) -> Doc:
    """Newest first; the cursor is the id of the last event seen."""
    query = select(AuditEventRow).order_by(AuditEventRow.id.desc()).limit(limit + 1)
    if cursor is not None:
        if not cursor.isdigit():
            raise MalformedBody("cursor: not a cursor this API gave out")
        query = query.where(AuditEventRow.id < int(cursor))
    if kind is not None:
        query = query.where(AuditEventRow.kind == kind)
    if name is not None:
        query = query.where(AuditEventRow.name == name)
    async with db.sessions() as session:
        rows = list((await session.execute(query)).scalars())
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "items": [
            {
                "id": row.id,
                "at": row.at.isoformat(),
                "revision": row.revision,
                "principal": row.principal,
                "action": row.action,
                "kind": row.kind,
                "name": row.name,
                "before": row.before,
                "after": row.after,
            }
            for row in rows
        ],
        "next": str(rows[-1].id) if more and rows else None,
    }
