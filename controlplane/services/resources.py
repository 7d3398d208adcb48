"""Use cases of the admin API on any kind; each call is one transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from controlplane.db.engine import Database
from controlplane.errors import (
    NotFound,
    PreconditionRequired,
    ValidationFailed,
    VersionMismatch,
)
from controlplane.schemas.common import Spec
from controlplane.services.kind import Kind, parse
from controlplane.services.placements import commit
from controlplane.services.revisions import RevisionFeed
from controlplane.services.sealing.sealer import Sealer
from controlplane.services.secrets import new_name
from controlplane.services.unit import Doc, RowT, UnitOfWork

ANY_VERSION = "*"


@dataclass(frozen=True)
class Written:
    """What a write returns: the object as a reader sees it, secrets shown once, the revision."""

    view: Doc
    secret: Doc
    revision: int | None


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def check_version(
    kind: Kind[Any],
    name: str,
    version: int,
    expected: set[int] | str | None,
    given: int | None = None,
) -> None:
    """If-Match's versions (`expected`), and a `version` the body gives, against the object's."""
    if expected is None:
        raise PreconditionRequired(
            f"send If-Match with the {kind.kind}'s ETag (its version) to change it"
        )
    if expected != ANY_VERSION and version not in expected:
        raise VersionMismatch(
            f"{kind.kind} {name!r} is at version {version}, not {sorted(expected)}",
            current_version=version,
        )
    if given is not None and given != version:
        raise VersionMismatch(
            f"{kind.kind} {name!r} is at version {version}; the body was read at {given}",
            current_version=version,
        )


def in_scope(kind: Kind[Any], row: RowT, scope: str | None) -> RowT:
    """The row, if a tenant admin of `scope` may see it (no scope: anyone who got this far);
    NotFound, as for a name that is not there, if not."""
    if scope is not None and not kind.belongs(row, scope):
        raise NotFound(f"no {kind.kind} named {row.name!r}", kind=kind.kind, name=row.name)
    return row


class Resources:
    def __init__(self, db: Database, feed: RevisionFeed, sealer: Sealer | None = None) -> None:
        self._db = db
        self._feed = feed
        self.sealer = sealer  # seals the secrets a write makes (a region's signing key)

    async def _published(self, written: Written) -> Written:
        await self._feed.published(written.revision)
        return written

    async def list(
        self, kind: Kind[Any], *, limit: int, cursor: str | None, scope: str | None = None
    ) -> Doc:
        """`scope`: a tenant admin's tenant; only its objects are listed."""
        query = select(kind.row).order_by(kind.row.name).limit(limit + 1)
        if scope is not None:
            query = kind.owned(query, scope)
        if cursor:
            query = query.where(kind.row.name > cursor)  # the last name of the page before
        async with self._db.sessions() as session:
            rows = list((await session.execute(query)).unique().scalars())
        more = len(rows) > limit
        rows = rows[:limit]
        return {
            "items": [kind.view(r) for r in rows],
            "next": rows[-1].name if more and rows else None,
        }

    async def version(self, kind: Kind[Any], name: str, scope: str | None = None) -> int:
        """The stored object's version; NotFound when there is none (in `scope`)."""
        query = select(kind.row.version).where(kind.row.name == name)
        if scope is not None:
            query = kind.owned(query, scope)
        async with self._db.sessions() as session:
            found = await session.scalar(query)
        if found is None:
            raise NotFound(f"no {kind.kind} named {name!r}", kind=kind.kind, name=name)
        return int(found)

    async def get(self, kind: Kind[Any], name: str, scope: str | None = None) -> Doc:
        async with self._db.sessions() as session:
            row = await UnitOfWork(session, "").get(kind.row, kind.kind, name)
            return kind.view(in_scope(kind, row, scope))

    async def create(
        self, kind: Kind[Any], name: str | None, spec: Spec, actor: str, scope: str | None = None
    ) -> Written:
        if scope is not None:
            kind.claim(spec, scope)
        if name is None:
            name = new_name(kind.name_prefix or kind.kind)
        async with self._db.sessions() as session, session.begin():
            uow = UnitOfWork(session, actor, sealer=self.sealer)
            row, secret = await kind.create(uow, name, spec)
            written = Written(kind.view(row), secret, await commit(uow))
        return await self._published(written)

    async def replace(
        self,
        kind: Kind[Any],
        name: str,
        spec: Spec,
        expected: set[int] | str | None,
        actor: str,
        version: int | None = None,
        scope: str | None = None,
    ) -> Written:
        async with self._db.sessions() as session, session.begin():
            uow = UnitOfWork(session, actor, sealer=self.sealer)
            row = in_scope(kind, await uow.get(kind.row, kind.kind, name, lock=True), scope)
            check_version(kind, name, row.version, expected, version)
            await kind.update(uow, row, spec)
            written = Written(kind.view(row), {}, await commit(uow))
        return await self._published(written)

    async def patch(
        self,
        kind: Kind[Any],
        name: str,
        patch: Doc,
        expected: set[int] | str | None,
        actor: str,
        scope: str | None = None,
    ) -> Written:
        schema = kind.update_spec or kind.spec
        async with self._db.sessions() as session, session.begin():
            uow = UnitOfWork(session, actor, sealer=self.sealer)
            row = in_scope(kind, await uow.get(kind.row, kind.kind, name, lock=True), scope)
            given = patch.get("version")
            check_version(kind, name, row.version, expected, given if type(given) is int else None)
            current = {k: v for k, v in kind.doc(row).items() if k in schema.model_fields}
            if patch.get("name", name) != name:
                raise ValidationFailed(
                    "the body names another object",
                    [{"field": "body.name", "message": f"is {patch['name']!r}, not {name!r}"}],
                )
            changes = {k: v for k, v in patch.items() if k not in kind.read_only()}
            spec = parse(schema, merge_patch(current, changes), ("body",))
            await kind.update(uow, row, spec)
            written = Written(kind.view(row), {}, await commit(uow))
        return await self._published(written)

    async def rotate(
        self, kind: Kind[Any], name: str, overlap_s: int, actor: str, scope: str | None = None
    ) -> Written:
        """A new secret for the object (shown once); the one before it works `overlap_s` more."""
        async with self._db.sessions() as session, session.begin():
            uow = UnitOfWork(session, actor, sealer=self.sealer)
            row = in_scope(kind, await uow.get(kind.row, kind.kind, name, lock=True), scope)
            secret = await kind.rotate(uow, row, overlap_s)
            written = Written(kind.view(row), secret, await commit(uow))
        return await self._published(written)

    async def delete(
        self,
        kind: Kind[Any],
        name: str,
        expected: set[int] | str | None,
        actor: str,
        *,
        cascade: bool,
        scope: str | None = None,
    ) -> int | None:
        async with self._db.sessions() as session, session.begin():
            uow = UnitOfWork(session, actor, sealer=self.sealer)
            row = in_scope(kind, await uow.get(kind.row, kind.kind, name, lock=True), scope)
            check_version(kind, name, row.version, expected)
            await kind.delete(uow, row, cascade=cascade)
            revision = await commit(uow)
        await self._feed.published(revision)
        return revision
