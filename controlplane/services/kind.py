"""One resource kind of the admin API: how its spec maps to a row, and its life cycle.

Every kind is created, updated and deleted through the same four functions here, so
validation, audit, versioning and the revision rule hold for all of them alike.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Generic, cast

from pydantic import BaseModel, Field, ValidationError, create_model
from pydantic.config import JsonDict
from sqlalchemy import Select, false, select
from sqlalchemy.exc import IntegrityError

from controlplane.db.base import NamedRow, utcnow
from controlplane.domain import Role
from controlplane.errors import AlreadyExists, HasDependents, ValidationFailed
from controlplane.schemas.common import Meta, Name, Spec
from controlplane.services.unit import Doc, RowT, UnitOfWork

# What a reader sees that the server sets: accepted on write, never applied.
SERVER_SET = {"name", "version", "created_at", "updated_at", "status"}
READ_ONLY: JsonDict = {"readOnly": True}
MAX_BIGINT = 2**63 - 1


@dataclass
class Dependent:
    """An object that stands in the way of a delete, and how a cascade removes it."""

    label: str
    remove: Callable[[UnitOfWork], Awaitable[None]]


def validation_errors(exc: ValidationError, prefix: tuple[str | int, ...] = ()) -> list[Doc]:
    """Pydantic's errors as `{field, message, type}`, the field a dotted path."""
    out = []
    for err in exc.errors(include_url=False):
        loc = [*prefix, *err["loc"]]
        out.append(
            {
                "field": ".".join(str(p) for p in loc) or "body",
                "message": err["msg"],
                "type": err["type"],
            }
        )
    return out


def parse(model: type[BaseModel], data: Any, prefix: tuple[str | int, ...] = ()) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ValidationFailed(
            "the body does not match the schema", validation_errors(exc, prefix)
        ) from exc


class Kind(Generic[RowT]):
    """The generic part of a kind; subclasses declare their row, schemas and references."""

    kind: ClassVar[str]
    plural: ClassVar[str]
    row: type[RowT]
    spec: ClassVar[type[Spec]]
    update_spec: ClassVar[type[Spec] | None] = None  # None: same as spec
    out: ClassVar[type[Meta]]
    write_role: ClassVar[Role] = Role.OPERATOR
    updatable: ClassVar[bool] = True
    name_prefix: ClassVar[str | None] = None  # set: a name is generated when none is given
    refs: ClassVar[dict[str, tuple[type[NamedRow], str]]] = {}
    server_set: ClassVar[frozenset[str]] = frozenset()  # more fields a reader sees, not set
    shown_once: ClassVar[str | None] = None  # the field of the secret mint() shows once
    rotatable: ClassVar[bool] = False  # its secret rotates, with an overlap (rotated())
    # What a tenant admin may do with its own tenant's objects of this kind: nothing, read
    # them, or read and write them ("read" | "write"); it never sees another tenant's.
    tenant_scope: ClassVar[str | None] = None

    def __init__(self) -> None:
        self.dependents_of: list[tuple[Kind[Any], str]] = []

    @cached_property
    def create_schema(self) -> type[Spec]:
        """The spec with its name, as POST and a fleet document take it."""
        return self._named("Create", optional=self.name_prefix is not None)

    @cached_property
    def created_schema(self) -> type[Meta]:
        """What a create answers: the object, and its secret, shown this once."""
        if self.shown_once is None:
            return self.out
        field: Any = (str, Field(description="the secret, shown this once; stored as a hash"))
        name = self.out.__name__.removesuffix("Out") + "Created"
        fields: dict[str, Any] = {self.shown_once: field}
        return cast(type[Meta], create_model(name, __base__=self.out, **fields))

    @cached_property
    def replace_schema(self) -> type[Spec]:
        """What PUT takes: the update spec; a name, if given, must be the object's own."""
        return self._named("Replace", optional=True, base=self.update_spec or self.spec)

    def _named(self, suffix: str, *, optional: bool, base: type[Spec] | None = None) -> type[Spec]:
        """The spec with its name, and the fields a reader sees that the server sets, so that
        what a GET returns can be written back (they are not applied; `version`, on a change,
        must be the current one)."""
        base = base or self.spec
        name_type: Any = Name | None if optional else Name
        observed = {
            field: (Any, Field(None, json_schema_extra=READ_ONLY, description="read-only"))
            for field in ("created_at", "updated_at", *sorted(self.server_set))
            if field not in base.model_fields
        }
        fields: dict[str, Any] = {
            "name": (name_type, None if optional else ...),
            "version": (int | None, Field(None, ge=1, le=MAX_BIGINT, json_schema_extra=READ_ONLY,
                                          description="read-only; on PUT, if given, must be "
                                          "the current version, as If-Match")),
            "status": (Any, Field(None, json_schema_extra=READ_ONLY,
                                  description="read-only: what the system observes")),
            **observed,
        }  # fmt: skip
        name = f"{base.__name__.removesuffix('Spec')}{suffix}"
        return cast(type[Spec], create_model(name, __base__=base, **fields))

    def spec_of(self, body: Spec, schema: type[Spec] | None = None) -> Spec:
        """The spec a written body (of create_schema or replace_schema) declares."""
        schema = schema or self.spec
        given = body.model_dump()
        return schema.model_validate({k: v for k, v in given.items() if k in schema.model_fields})

    def read_only(self) -> set[str]:
        """The fields a reader sees that a write may carry but never sets."""
        return SERVER_SET | self.server_set

    # --- mapping between spec and row -------------------------------------------------

    def doc(self, row: RowT) -> Doc:
        """The spec of a stored object, normalised and JSON-ready; what audit and diff compare."""
        raw: Doc = {}
        for field in self.spec.model_fields:
            value = getattr(row, field)
            raw[field] = value.name if field in self.refs and value is not None else value
        return self.spec.model_validate(raw).model_dump(mode="json")

    def status(self, row: RowT) -> Doc:
        return {}

    def view(self, row: RowT) -> Doc:
        """What a reader sees: name, spec, status (what the system observes, read-only) and
        metadata."""
        status = self.status(row)
        body = {"name": row.name, **self.doc(row), **({"status": status} if status else {})}
        body.update(version=row.version, created_at=row.created_at, updated_at=row.updated_at)
        return self.out.model_validate(body).model_dump(mode="json")

    async def assign(self, uow: UnitOfWork, row: RowT, spec: Spec) -> None:
        values = spec.model_dump()
        for field in type(spec).model_fields:
            value = values[field]
            if field in self.refs:
                target, kind = self.refs[field]
                value = None if value is None else await uow.ref(target, kind, value, field)
            setattr(row, field, value)

    async def validate(self, uow: UnitOfWork, row: RowT) -> None:
        """Checks across objects, after assign; raise to refuse."""

    def belongs(self, row: RowT, tenant: str) -> bool:
        """Whether the object is `tenant`'s (for a kind with a tenant scope)."""
        return False

    def owned(self, query: Select[tuple[RowT]], tenant: str) -> Select[tuple[RowT]]:
        """`query` kept to the objects of `tenant`."""
        return query.where(false())

    def claim(self, spec: Spec, tenant: str) -> None:
        """Refuse a spec a tenant admin of `tenant` may not write (as if what it names were
        not there: another tenant's existence is never told)."""

    def mint(self, row: RowT) -> Doc:
        """For kinds with a secret: set its hash on the row and return it, shown once."""
        return {}

    def rotated(self, row: RowT, overlap_s: int) -> Doc:
        """For kinds that rotate: a new secret (shown once), the one before it kept as the
        previous, accepted for `overlap_s` more (never past its own expiry)."""
        raise NotImplementedError

    # --- life cycle ------------------------------------------------------------------

    async def create(self, uow: UnitOfWork, name: str, spec: Spec) -> tuple[RowT, Doc]:
        if await uow.find(self.row, name) is not None:
            raise AlreadyExists(f"a {self.kind} named {name!r} exists", kind=self.kind, name=name)
        row = self.row(name=name, version=1)
        await self.assign(uow, row, spec)
        await self.validate(uow, row)
        secret = self.mint(row)
        uow.session.add(row)
        await self._flush(uow, name)
        uow.created(row)
        uow.record("create", self.kind, name, None, self.doc(row))
        await self.created(uow, row)
        return row, secret

    async def created(self, uow: UnitOfWork, row: RowT) -> None:
        """What else a new object brings into being, in its transaction."""

    async def update(self, uow: UnitOfWork, row: RowT, spec: Spec) -> bool:
        """Apply a full spec; False, with nothing written, when it changes nothing."""
        before = self.doc(row)
        await self.assign(uow, row, spec)
        await self.validate(uow, row)
        after = self.doc(row)
        if before == after:
            await uow.session.refresh(row)  # drop the unflushed no-op assignments
            return False
        row.version += 1
        row.updated_at = utcnow()
        await self._flush(uow, row.name)
        uow.record("update", self.kind, row.name, before, after)
        return True

    async def rotate(self, uow: UnitOfWork, row: RowT, overlap_s: int) -> Doc:
        before = self.doc(row)
        secret = self.rotated(row, overlap_s)
        row.version += 1
        row.updated_at = utcnow()
        await self._flush(uow, row.name)
        uow.record("update", self.kind, row.name, before, self.doc(row))
        return secret

    async def delete(self, uow: UnitOfWork, row: RowT, *, cascade: bool) -> None:
        dependents = await self.dependents(uow, row)
        if dependents and not cascade:
            labels = [d.label for d in dependents]
            raise HasDependents(
                f"{self.kind} {row.name!r} is used by {', '.join(labels)}; "
                "remove them first or delete with ?cascade=true",
                labels,
            )
        for dependent in dependents:
            await dependent.remove(uow)
        uow.record("delete", self.kind, row.name, self.doc(row), None)
        await uow.session.delete(row)
        await uow.session.flush()
        uow.deleted(row)

    async def dependents(self, uow: UnitOfWork, row: RowT) -> list[Dependent]:
        found: list[Dependent] = []
        for kind, fk in self.dependents_of:
            rows = (
                (
                    await uow.session.execute(
                        select(kind.row)
                        .where(getattr(kind.row, fk) == row.id)
                        .order_by(kind.row.name)
                    )
                )
                .unique()
                .scalars()
            )
            found.extend(kind.dependent(r) for r in rows)
        return found

    def dependent(self, row: RowT) -> Dependent:
        async def remove(uow: UnitOfWork) -> None:
            await self.delete(uow, row, cascade=True)

        return Dependent(f"{self.kind} {row.name}", remove)

    async def _flush(self, uow: UnitOfWork, name: str) -> None:
        try:
            await uow.session.flush()
        except IntegrityError as exc:
            constraint = getattr(getattr(exc.orig, "diag", None), "constraint_name", None)
            raise AlreadyExists(
                f"{self.kind} {name!r} conflicts with an existing {self.kind} "
                f"({constraint or 'a unique constraint'})",
                kind=self.kind,
                name=name,
            ) from exc
