"""Declarative apply: make the fleet match a document, in one transaction, and say what changed.

A document lists objects per kind. A kind the document names is managed: objects of that kind
that the document leaves out are deleted, unless the apply is asked not to prune (then it only
creates and updates, as `meridian up` applies its example beside what an operator added). A
kind it does not name is left as it is.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from controlplane.db.engine import Database
from controlplane.domain import Role
from controlplane.errors import ValidationFailed
from controlplane.services.kind import Kind, parse
from controlplane.services.placements import commit
from controlplane.services.registry import APPLY_KINDS
from controlplane.services.revisions import RevisionFeed
from controlplane.services.sealing.sealer import Sealer
from controlplane.services.unit import Doc, UnitOfWork, current_revision

API_VERSION = "meridian/v1"
Plan = list[tuple[Kind[Any], list[tuple[str, Any]]]]


def parse_document(document: Any) -> Plan:
    """The document's objects per kind, validated, or a 422 naming every bad field."""
    if not isinstance(document, dict):
        raise ValidationFailed(
            "a fleet document is a mapping",
            [{"field": "body", "message": "expected a mapping of kinds to lists"}],
        )
    errors: list[Doc] = []
    version = document.get("apiVersion", API_VERSION)
    if version != API_VERSION:
        errors.append({"field": "apiVersion", "message": f"expected {API_VERSION!r}"})
    for key in document:
        if key != "apiVersion" and key not in APPLY_KINDS:
            errors.append({"field": key, "message": f"unknown kind; one of {list(APPLY_KINDS)}"})
    plan: Plan = []
    for key, kind in APPLY_KINDS.items():
        items = document.get(key)
        if items is None:
            continue
        if not isinstance(items, list):
            errors.append({"field": key, "message": "expected a list"})
            continue
        parsed, seen = [], set()
        for index, item in enumerate(items):
            try:
                spec = parse(kind.create_schema, item, (key, index))
            except ValidationFailed as exc:
                errors.extend(exc.extra["errors"])
                continue
            name = spec.name
            if name in seen:
                errors.append({"field": f"{key}.{index}.name", "message": f"{name!r} repeats"})
            seen.add(name)
            parsed.append((name, kind.spec_of(spec)))
        plan.append((kind, parsed))
    if errors:
        raise ValidationFailed("the fleet document is not valid", errors)
    return plan


def required_role(plan: Plan) -> Role:
    return max((kind.write_role for kind, _ in plan), key=lambda r: r.rank, default=Role.OPERATOR)


class _DryRun(Exception):
    def __init__(self, result: Doc) -> None:
        self.result = result


async def apply_plan(
    db: Database,
    feed: RevisionFeed,
    plan: Plan,
    actor: str,
    *,
    dry_run: bool,
    cascade: bool,
    prune: bool = True,
    sealer: Sealer | None = None,
) -> Doc:
    try:
        result = await _apply(
            db, plan, actor, dry_run=dry_run, cascade=cascade, prune=prune, sealer=sealer
        )
    except _DryRun as preview:
        return preview.result
    if result["changed"]:
        await feed.published(result["revision"])
    return result


async def _apply(
    db: Database,
    plan: Plan,
    actor: str,
    *,
    dry_run: bool,
    cascade: bool,
    prune: bool,
    sealer: Sealer | None,
) -> Doc:
    async with db.sessions() as session, session.begin():
        uow = UnitOfWork(session, actor, sealer=sealer)
        for kind, items in plan:
            await uow.prefetch(kind.row, (name for name, _ in items), lock=True)
            for name, spec in items:
                row = await uow.find(kind.row, name, lock=True)
                if row is None:
                    await kind.create(uow, name, spec)
                else:
                    await kind.update(uow, row, spec)
        for kind, items in reversed(plan if prune else []):
            wanted = {name for name, _ in items}
            query = select(kind.row).where(kind.row.name.not_in(wanted)).order_by(kind.row.name)
            for row in list((await session.execute(query)).unique().scalars()):
                await kind.delete(uow, row, cascade=cascade)
        # what the document declares; what its objects bring along (a region's signing key)
        # is in the audit log, not in the diff
        declared = {kind.kind for kind, _ in plan}
        changes = [change.as_json() for change in uow.changes if change.kind in declared]
        result = {"dry_run": dry_run, "changed": bool(changes), "changes": changes}
        if dry_run:
            raise _DryRun({**result, "revision": await current_revision(session)})
        revision = await commit(uow) or await current_revision(session)
    return {**result, "revision": revision}
