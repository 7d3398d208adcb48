"""A unit of work: one transaction, the changes it made, and the one revision bump they earn."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

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
    # rows read in this transaction by (type, name), and whether locked; names known absent
    _found: dict[tuple[type[NamedRow], str], tuple[NamedRow, bool]] = field(
        default_factory=dict, repr=False
    )
    _absent: set[tuple[type[NamedRow], str]] = field(default_factory=set, repr=False)
    _names: dict[type[NamedRow], set[str]] = field(default_factory=dict, repr=False)

    def record(
        self, action: str, kind: str, name: str, before: Doc | None, after: Doc | None
    ) -> None:
        self.changes.append(Change(action, kind, name, before, after))

    async def find(self, row_type: type[RowT], name: str, *, lock: bool = False) -> RowT | None:
        """The row named, read once per transaction (a lock asked for later reads it again,
        locked); a name found absent is None until this unit creates it."""
        key = (row_type, name)
        if key in self._absent:
            return None
        hit = self._found.get(key)
        if hit is not None and (hit[1] or not lock):
            return cast(RowT, hit[0])
        query = select(row_type).where(row_type.name == name)
        if lock:
            query = query.with_for_update(of=row_type)
        row = (await self.session.execute(query)).unique().scalar_one_or_none()
        if row is None:
            self._absent.add(key)  # until this unit creates it (Kind.create, the only way)
        else:
            self._found[key] = (row, lock)
        return row

    async def prefetch(self, row_type: type[RowT], names: Iterable[str], *, lock: bool) -> None:
        """One query for the finds of many names to come (an apply's): the rows there, and
        the names that are not."""
        wanted = set(names)
        query = select(row_type).where(row_type.name.in_(wanted))
        if lock:
            query = query.with_for_update(of=row_type)
        rows = (await self.session.execute(query)).unique().scalars().all()
        for row in rows:
            self._found[(row_type, row.name)] = (row, lock)
        self._absent.update((row_type, n) for n in wanted - {row.name for row in rows})

    async def names(self, row_type: type[NamedRow]) -> set[str]:
        """Every name of a kind, read once per transaction (this unit's creations and
        deletions kept in it)."""
        found = self._names.get(row_type)
        if found is None:
            found = set((await self.session.execute(select(row_type.name))).scalars())
            self._names[row_type] = found
        return found

    def created(self, row: NamedRow) -> None:
        """A row this unit added (and flushed): found from now on."""
        key = (type(row), row.name)
        self._absent.discard(key)
        self._found[key] = (row, True)
        self._names.get(type(row), set()).add(row.name)

    def deleted(self, row: NamedRow) -> None:
        self._found.pop((type(row), row.name), None)
        self._names.get(type(row), set()).discard(row.name)

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
