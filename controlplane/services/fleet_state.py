"""The fleet at one revision, read in one consistent transaction, and compiled per region.

`FleetReader` keeps the last fleet it read and, for a newer revision, reads again only the
objects the audit log names as changed since: a write to one tenant of a fleet of 5,000
nodes reads one row, not 5,000. The objects that did not change stay the same objects, which
the incremental compile (push/parts.py) relies on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.access_rows import ApiKeyRow, TenantRow
from controlplane.db.audit_rows import AuditEventRow
from controlplane.db.engine import Database
from controlplane.db.fleet_rows import (
    AdapterRow,
    DeploymentRow,
    EngineSlotRow,
    NodeRow,
    RegionRow,
)
from controlplane.db.planner_rows import AdapterPlanRow, EnginePlanRow
from controlplane.services.access_kinds import API_KEY, TENANT
from controlplane.services.adapter_kind import ADAPTER
from controlplane.services.fleet_kinds import DEPLOYMENT, MODEL, NODE, REGION
from controlplane.services.registry import APPLY_KINDS
from controlplane.services.sealing.signing import KIND as SIGNING_KEY
from controlplane.services.sealing.signing import read_keys
from controlplane.services.unit import current_revision
from controlplane.snapshot import FleetState, RegionSnapshot, compile_region
from controlplane.snapshot.types import ApiKeyState, Slot

PLACEMENT_KEYS = ("regions", "nodes", "models", "deployments")
ENGINE_PLAN = "engine-plan"  # the audit's kind for the capacity planner's engine counts
ADAPTER_PLAN = "adapter-plan"  # and for the leader's residency of adapters
# what rewrites slots
MOVES_ENGINES = {DEPLOYMENT.kind, NODE.kind, MODEL.kind, REGION.kind, ENGINE_PLAN}


async def load_fleet_state(db: Database) -> FleetState:
    async with db.sessions() as session, session.begin():
        await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        return await read_fleet_state(session)


async def read_fleet_state(session: AsyncSession, keys: Iterable[str] = APPLY_KINDS) -> FleetState:
    """The kinds named by `keys` (all by default), the API keys with them, and the slots."""
    keys = list(keys)
    state: dict[str, Any] = {"revision": await current_revision(session)}
    for key in keys:
        kind = APPLY_KINDS[key]
        rows = (await session.execute(select(kind.row))).unique().scalars()
        state[key] = {row.name: kind.doc(row) for row in rows}
    if "tenants" in keys:
        state["api_keys"] = await _api_keys(session)
    if "regions" in keys:
        state["signing_keys"] = await read_keys(session)
    if "deployments" in keys:
        state["planned"] = await _planned(session)
    if "adapters" in keys:
        state["resident"] = await _resident(session)
    state["slots"] = await _slots(session, {})
    return FleetState.model_validate(state)


class FleetReader:
    """The newest fleet, read again only where it changed since the last read."""

    def __init__(self) -> None:
        self.state: FleetState | None = None
        self.full_reads = 0  # for tests and the benchmark

    async def read(self, session: AsyncSession) -> FleetState:
        """Within the caller's (repeatable-read) transaction."""
        revision = await current_revision(session)
        last = self.state
        if last is not None and revision == last.revision:
            return last
        changed = (
            None
            if last is None or revision < last.revision
            else (await _changed_since(session, last.revision, revision))
        )
        if last is None or changed is None:
            self.full_reads += 1
            self.state = await read_fleet_state(session)
        else:
            self.state = await _patched(session, last, revision, changed)
        return self.state


async def _changed_since(
    session: AsyncSession, after: int, upto: int
) -> dict[str, set[str]] | None:
    """The names of what changed, by kind; None when the audit log does not account for
    every revision in between (the whole fleet is read then)."""
    rows = await session.execute(
        select(AuditEventRow.revision, AuditEventRow.kind, AuditEventRow.name).where(
            AuditEventRow.revision > after, AuditEventRow.revision <= upto
        )
    )
    revisions: set[int] = set()
    changed: dict[str, set[str]] = {}
    for revision, kind, name in rows:
        revisions.add(revision)
        changed.setdefault(kind, set()).add(name)
    return changed if len(revisions) == upto - after else None


async def _patched(
    session: AsyncSession, last: FleetState, revision: int, changed: dict[str, set[str]]
) -> FleetState:
    update: dict[str, Any] = {"revision": revision}
    for key, kind in APPLY_KINDS.items():
        names = changed.get(kind.kind)
        if not names:
            continue
        rows = (await session.execute(select(kind.row).where(kind.row.name.in_(names)))).unique()
        docs = {row.name: kind.doc(row) for row in rows.scalars()}
        fresh = getattr(FleetState.model_validate({"revision": revision, key: docs}), key)
        now = {n: v for n, v in getattr(last, key).items() if n not in names}
        now.update(fresh)
        update[key] = dict(sorted(now.items()))
    keys, tenants = changed.get(API_KEY.kind, set()), changed.get(TENANT.kind, set())
    if keys or tenants:
        fresh_keys = await _api_keys(session, keys, tenants)
        now_keys = {
            n: k for n, k in last.api_keys.items() if n not in keys and k.tenant not in tenants
        }
        now_keys.update(fresh_keys)
        update["api_keys"] = dict(sorted(now_keys.items()))
    if REGION.kind in changed or SIGNING_KEY in changed:
        update["signing_keys"] = await read_keys(session)
    if ENGINE_PLAN in changed or DEPLOYMENT.kind in changed:
        update["planned"] = await _planned(session)
    if ADAPTER_PLAN in changed or ADAPTER.kind in changed or REGION.kind in changed:
        update["resident"] = await _resident(session)
    if MOVES_ENGINES & changed.keys():
        update["slots"] = await _slots(session, last.slots)
    return last.model_copy(update=update)


async def _planned(session: AsyncSession) -> dict[str, int]:
    rows = await session.execute(
        select(DeploymentRow.name, EnginePlanRow.engines)
        .join(EnginePlanRow, EnginePlanRow.deployment_id == DeploymentRow.id)
        .order_by(DeploymentRow.name)
    )
    return {name: engines for name, engines in rows}


async def _resident(session: AsyncSession) -> dict[str, dict[str, int]]:
    rows = await session.execute(
        select(AdapterRow.name, RegionRow.name, AdapterPlanRow.engines)
        .join(AdapterPlanRow, AdapterPlanRow.adapter_id == AdapterRow.id)
        .join(RegionRow, RegionRow.id == AdapterPlanRow.region_id)
        .where(AdapterPlanRow.engines > 0)
        .order_by(AdapterRow.name, RegionRow.name)
    )  # fmt: skip
    out: dict[str, dict[str, int]] = {}
    for adapter, region, engines in rows:
        out.setdefault(adapter, {})[region] = engines
    return out


async def _slots(session: AsyncSession, last: dict[str, Slot]) -> dict[str, Slot]:
    """Every engine's slot; a slot that did not move is the object `last` has."""
    rows = await session.execute(
        select(EngineSlotRow.engine_id, NodeRow.name, EngineSlotRow.gpu_indexes, EngineSlotRow.port)
        .join(NodeRow, NodeRow.id == EngineSlotRow.node_id)
    )  # fmt: skip
    slots = {}
    for engine, node, gpus, port in rows:
        old = last.get(engine)
        same = old is not None and (old.node, old.gpu_indexes, old.port) == (node, gpus, port)
        slots[engine] = (
            old if same and old is not None else Slot(node=node, gpu_indexes=gpus, port=port)
        )
    return slots


async def _api_keys(
    session: AsyncSession, names: set[str] | None = None, tenants: set[str] | None = None
) -> dict[str, ApiKeyState]:
    """The keys not revoked: all of them, or those named and those of the tenants named."""
    query = select(ApiKeyRow).where(ApiKeyRow.revoked_at.is_(None))
    if names is not None or tenants is not None:
        tenant_ids = select(TenantRow.id).where(TenantRow.name.in_(tenants or set()))
        query = query.where(
            ApiKeyRow.name.in_(names or set()) | ApiKeyRow.tenant_id.in_(tenant_ids)
        )
    return {
        k.name: ApiKeyState(
            tenant=k.tenant.name,
            prefix=k.prefix,
            key_hash=k.key_hash,
            expires_at=k.expires_at,
            previous_hash=k.previous_key_hash,
            previous_expires_at=k.previous_expires_at,
        )
        for k in (await session.execute(query)).unique().scalars()
    }


async def region_snapshots(db: Database) -> dict[str, RegionSnapshot]:
    state = await load_fleet_state(db)
    return {region: compile_region(state, region) for region in sorted(state.regions)}
