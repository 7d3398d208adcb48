"""Sticky placement, kept in PostgreSQL.

Every committed change that can move engines (a deployment, node, model or region) ends with
the engines' slots brought up to date in the same transaction: engines keep the node, GPUs
and port they had while those still fit (see snapshot/placement.py), and only the others are
placed anew. It runs after the revision bump, whose row lock orders concurrent writers, so
each one places on top of the slots the previous one committed. The compiler reads the slots
with the rest of the fleet, so every replica compiles the same placement for a revision.
"""

from __future__ import annotations

from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.audit_rows import ConfigRevisionRow
from controlplane.db.engine import Database
from controlplane.db.fleet_rows import DeploymentRow, EngineSlotRow, NodeRow
from controlplane.services.fleet_state import MOVES_ENGINES, PLACEMENT_KEYS, read_fleet_state
from controlplane.services.rollouts.begin import on_commit, seed_intent
from controlplane.services.unit import UnitOfWork
from controlplane.snapshot.placement import place
from controlplane.snapshot.types import Slot


async def commit(uow: UnitOfWork) -> int | None:
    """Bump the revision if anything changed, and keep the slots in step with the change."""
    revision = await uow.commit_revision()
    if any(change.kind in MOVES_ENGINES for change in uow.changes):
        await keep_slots(uow.session)
    if revision is not None:
        await on_commit(uow, revision)
    return revision


async def seed_slots(db: Database) -> None:
    """At start: record the slots of a fleet that has none yet (a database from before slots).
    Placing without slots gives what the agents already run, so nothing moves."""
    async with db.sessions() as session, session.begin():
        lock = select(ConfigRevisionRow.id).where(ConfigRevisionRow.id == 1).with_for_update()
        await session.execute(lock)
        await keep_slots(session)
        await seed_intent(session)


async def keep_slots(session: AsyncSession) -> None:
    await session.flush()
    state = await read_fleet_state(session, PLACEMENT_KEYS)
    wanted: dict[str, tuple[str, Slot]] = {}
    for region in state.regions:
        plans, _ = place(state, region)
        for plan in plans:
            for engine in plan.engines:
                slot = Slot(node=plan.name, gpu_indexes=engine.gpu_indexes, port=engine.port)
                wanted[engine.id] = (engine.deployment, slot)
    stale = [e for e, slot in state.slots.items() if e not in wanted or wanted[e][1] != slot]
    if stale:
        await session.execute(delete(EngineSlotRow).where(EngineSlotRow.engine_id.in_(stale)))
    new = {e: w for e, w in wanted.items() if e not in state.slots or e in stale}
    if not new:
        return
    nodes = {name: i for name, i in await session.execute(select(NodeRow.name, NodeRow.id))}
    deployments = {
        name: i for name, i in await session.execute(select(DeploymentRow.name, DeploymentRow.id))
    }
    await session.execute(
        insert(EngineSlotRow),
        [
            {
                "engine_id": engine,
                "deployment_id": deployments[deployment],
                "node_id": nodes[slot.node],
                "gpu_indexes": slot.gpu_indexes,
                "port": slot.port,
            }
            for engine, (deployment, slot) in sorted(new.items())
        ],
    )
