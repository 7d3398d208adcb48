"""The fleet at one revision, read in one consistent transaction, and compiled per region."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.access_rows import ApiKeyRow
from controlplane.db.engine import Database
from controlplane.db.fleet_rows import EngineSlotRow, NodeRow, RegionRow
from controlplane.services.registry import APPLY_KINDS
from controlplane.services.unit import current_revision
from controlplane.snapshot import FleetState, RegionSnapshot, compile_region
from controlplane.snapshot.types import ApiKeyState

PLACEMENT_KEYS = ("regions", "nodes", "models", "deployments")


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
        keys_of = await session.execute(select(RegionRow.name, RegionRow.signing_key))
        state["signing_keys"] = {name: base64.b64encode(k).decode() for name, k in keys_of}
    slots = await session.execute(
        select(EngineSlotRow.engine_id, NodeRow.name, EngineSlotRow.gpu_indexes, EngineSlotRow.port)
        .join(NodeRow, NodeRow.id == EngineSlotRow.node_id)
    )  # fmt: skip
    state["slots"] = {
        engine: {"node": node, "gpu_indexes": gpus, "port": port}
        for engine, node, gpus, port in slots
    }
    return FleetState.model_validate(state)


async def _api_keys(session: AsyncSession) -> dict[str, ApiKeyState]:
    query = select(ApiKeyRow).where(ApiKeyRow.revoked_at.is_(None))
    return {
        k.name: ApiKeyState(
            tenant=k.tenant.name, prefix=k.prefix, key_hash=k.key_hash, expires_at=k.expires_at
        )
        for k in (await session.execute(query)).unique().scalars()
    }


async def region_snapshots(db: Database) -> dict[str, RegionSnapshot]:
    state = await load_fleet_state(db)
    return {region: compile_region(state, region) for region in sorted(state.regions)}
