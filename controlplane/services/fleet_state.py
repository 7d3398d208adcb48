"""The fleet at one revision, read in one consistent transaction, and compiled per region."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from controlplane.db.access_rows import ApiKeyRow
from controlplane.db.engine import Database
from controlplane.services.apply import APPLY_KINDS
from controlplane.services.unit import current_revision
from controlplane.snapshot import FleetState, RegionSnapshot, compile_region
from controlplane.snapshot.types import ApiKeyState


async def load_fleet_state(db: Database) -> FleetState:
    async with db.sessions() as session, session.begin():
        await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        state: dict[str, Any] = {"revision": await current_revision(session)}
        for key, kind in APPLY_KINDS.items():
            rows = (await session.execute(select(kind.row))).unique().scalars()
            state[key] = {row.name: kind.doc(row) for row in rows}
        keys = (
            (await session.execute(select(ApiKeyRow).where(ApiKeyRow.revoked_at.is_(None))))
            .unique()
            .scalars()
        )
        state["api_keys"] = {
            k.name: ApiKeyState(
                tenant=k.tenant.name, prefix=k.prefix, key_hash=k.key_hash, expires_at=k.expires_at
            )
            for k in keys
        }
    return FleetState.model_validate(state)


async def region_snapshots(db: Database) -> dict[str, RegionSnapshot]:
    state = await load_fleet_state(db)
    return {region: compile_region(state, region) for region in sorted(state.regions)}
