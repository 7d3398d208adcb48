"""A unit of work: one transaction, the changes it made, and the one revision bump they earn."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.audit_rows import AuditEventRow, ConfigRevisionRow
from controlplane.db.base import NamedRow
from controlplane.errors import NotFound, UnknownReference

if TYPE_CHECKING:
    from controlplane.services.sealing.sealer import Sealer

RowT = TypeVar("RowT", bound=NamedRow)
Doc = dict[str, Any]


@dataclass(frozen=True)
class Change:
    action: str  # create | update | delete
    kind: str
    name: str
    before: Doc | None
    after: Doc | None

    def fields(self) -> dict[str, list[Any]]:
        """For an update, each changed field as [before, after]."""
        before, after = self.before or {}, self.after or {}
        keys = sorted(set(before) | set(after))
        return {k: [before.get(k), after.get(k)] for k in keys if before.get(k) != after.get(k)}

    def as_json(self) -> Doc:
        out: Doc = {"action": self.action, "kind": self.kind, "name": self.name}
        if self.action == "update":
            out["changes"] = self.fields()
        elif self.action == "create":
            out["after"] = self.after
        else:
            out["before"] = self.before
        return out


@dataclass
class UnitOfWork:
    session: AsyncSession
    actor: str
    changes: list[Change] = field(default_factory=list)
    sealer: Sealer | None = None  # where a change makes a secret to store (a region's key)

    def record(
        self, action: str, kind: str, name: str, before: Doc | None, after: Doc | None
    ) -> None:
        self.changes.append(Change(action, kind, name, before, after))

    async def find(self, row_type: type[RowT], name: str, *, lock: bool = False) -> RowT | None:
        query = select(row_type).where(row_type.name == name)
        if lock:
            query = query.with_for_update(of=row_type)
        return (await self.session.execute(query)).unique().scalar_one_or_none()

    async def get(self, row_type: type[RowT], kind: str, name: str, *, lock: bool = False) -> RowT:
        row = await self.find(row_type, name, lock=lock)
        if row is None:
            raise NotFound(f"no {kind} named {name!r}", kind=kind, name=name)
        return row

    async def ref(self, row_type: type[RowT], kind: str, name: str, field_name: str) -> RowT:
        """The row a spec field names, or a 422 that names the field."""
        row = await self.find(row_type, name)
        if row is None:
            raise UnknownReference(field_name, kind, name)
        return row

    async def commit_revision(self) -> int | None:
        """Bump the revision once if anything changed, and write the audit events under it."""
        if not self.changes:
            return None
        revision: int = (
            await self.session.execute(
                update(ConfigRevisionRow)
                .where(ConfigRevisionRow.id == 1)
                .values(revision=ConfigRevisionRow.revision + 1, updated_at=func.now())
                .returning(ConfigRevisionRow.revision)
            )
        ).scalar_one()
        self.session.add_all(
            AuditEventRow(
                revision=revision,
                principal=self.actor,
                action=c.action,
                kind=c.kind,
                name=c.name,
                before=c.before,
                after=c.after,
            )
            for c in self.changes
        )
        return revision


async def current_revision(session: AsyncSession) -> int:
    value = await session.scalar(
        select(ConfigRevisionRow.revision).where(ConfigRevisionRow.id == 1)
    )
    return int(value or 0)
