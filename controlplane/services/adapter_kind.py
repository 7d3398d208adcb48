"""LoRA adapters as a kind of the admin API and of fleet documents (issue 45): validated
(its base model and tenants exist, its name is no model's or tiered route's, since clients
name all three in `model`), audited and versioned as every kind is. A new source or digest
is a new version of the adapter: a change of the fleet's intent, rolled out in waves as any.
"""

from __future__ import annotations

from sqlalchemy import Select, select

from controlplane.db.access_rows import TenantRow
from controlplane.db.fleet_rows import AdapterRow, ModelRow, TieredRouteRow
from controlplane.errors import NameTaken
from controlplane.schemas.adapters import AdapterOut, AdapterSpec
from controlplane.services.kind import Dependent, Kind
from controlplane.services.unit import UnitOfWork

# what else a client names in `model`
CLIENT_NAMES: tuple[tuple[type[ModelRow] | type[TieredRouteRow] | type[AdapterRow], str], ...] = (
    (ModelRow, "a model"),
    (TieredRouteRow, "a tiered route"),
    (AdapterRow, "an adapter"),
)


async def name_taken(uow: UnitOfWork, name: str, own: type[object]) -> None:
    """Refuse `name` where a model, tiered route or adapter (of another kind than `own`) has
    it: clients could not tell them apart."""
    for row_type, what in CLIENT_NAMES:
        if row_type is not own and name in await uow.names(row_type):
            raise NameTaken(f"{what} is named {name!r}: clients could not tell them apart")


class AdapterKind(Kind[AdapterRow]):
    kind, plural, row, spec, out = "adapter", "adapters", AdapterRow, AdapterSpec, AdapterOut
    refs = {"base_model": (ModelRow, "model")}
    tenant_scope = "read"  # a tenant admin sees the adapters its tenant may use

    def belongs(self, row: AdapterRow, tenant: str) -> bool:
        return tenant in row.tenants

    def owned(self, query: Select[tuple[AdapterRow]], tenant: str) -> Select[tuple[AdapterRow]]:
        return query.where(AdapterRow.tenants.contains([tenant]))

    async def validate(self, uow: UnitOfWork, row: AdapterRow) -> None:
        await name_taken(uow, row.name, AdapterRow)
        for index, tenant in enumerate(row.tenants):
            await uow.ref(TenantRow, "tenant", tenant, f"tenants.{index}")


ADAPTER = AdapterKind()


async def tenant_users(uow: UnitOfWork, tenant: TenantRow) -> list[Dependent]:
    """The adapters that name a tenant about to be deleted: a cascade takes it out of them."""
    query = (
        select(AdapterRow)
        .where(AdapterRow.tenants.contains([tenant.name]))
        .order_by(AdapterRow.name)
    )
    found = []
    for adapter in (await uow.session.execute(query)).unique().scalars():
        found.append(_drop_tenant(adapter, tenant.name))
    return found


def _drop_tenant(adapter: AdapterRow, tenant: str) -> Dependent:
    async def remove(uow: UnitOfWork) -> None:
        current = ADAPTER.doc(adapter)
        left = [t for t in current["tenants"] if t != tenant]
        await ADAPTER.update(uow, adapter, AdapterSpec.model_validate({**current, "tenants": left}))

    return Dependent(f"adapter {adapter.name} (tenant)", remove)
