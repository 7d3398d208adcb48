"""Rollout state in PostgreSQL: the states, the policy in force, and what targets hold.

Everything a rollout decides is written here in the same transaction as the revision it
bumps, so a replica or PostgreSQL that dies mid-rollout loses nothing: the next leader reads
where it stood and goes on.
"""

from __future__ import annotations

from enum import StrEnum

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.audit_rows import ConfigRevisionRow
from controlplane.db.fleet_rows import NodeRow, RegionRow
from controlplane.db.rollout_rows import HoldingRow, IntentRow, RolloutPolicyRow, RolloutRow
from controlplane.schemas.rollout import ROLLOUT_POLICY, RolloutPolicySpec
from controlplane.services.rollouts.compose import Holdings, Intent
from controlplane.services.rollouts.kind import ROLLOUT_POLICY_KIND


class State(StrEnum):
    ROLLING = "rolling"  # a wave is baking
    PAUSED = "paused"  # by an operator, or waiting too long for traffic to judge
    COMPLETE = "complete"  # every target holds it, and every check passed
    ROLLED_BACK = "rolled_back"  # a check failed: the targets hold the last good intent
    ABORTED = "aborted"  # an operator rolled it back
    SUPERSEDED = "superseded"  # a newer change took its place mid-way
    IMMEDIATE = "immediate"  # the policy sent it everywhere at once, unjudged


ACTIVE = frozenset({State.ROLLING, State.PAUSED})
HELD_BACK = frozenset({State.ROLLED_BACK, State.ABORTED})


async def policy(session: AsyncSession) -> RolloutPolicySpec:
    row = await session.scalar(
        select(RolloutPolicyRow).where(RolloutPolicyRow.name == ROLLOUT_POLICY)
    )
    if row is None:
        return RolloutPolicySpec()
    return RolloutPolicySpec.model_validate(ROLLOUT_POLICY_KIND.doc(row))


async def serialize(session: AsyncSession) -> None:
    """Take the revision row's lock, as every writer does before it touches rollouts: one
    order of locks (the revision, then the rollout) for writers, the driver and operators,
    so that none waits on another in a cycle, and the newest rollout read after it is the
    newest there is."""
    await session.execute(
        select(ConfigRevisionRow.id).where(ConfigRevisionRow.id == 1).with_for_update()
    )


async def latest(session: AsyncSession, *, lock: bool = False) -> RolloutRow | None:
    query = select(RolloutRow).order_by(RolloutRow.id.desc()).limit(1)
    if lock:
        query = query.with_for_update()
    row: RolloutRow | None = await session.scalar(query)
    return row


async def last_good(session: AsyncSession, newest: RolloutRow | None, before: int) -> int | None:
    """The intent revision every target held (or went back to) last, before revision `before`
    changed it: the base of a rollout not finished or rolled back, else the intent before."""
    if newest is not None and State(newest.state) in ACTIVE | HELD_BACK:
        return newest.base
    found: int | None = await session.scalar(
        select(func.max(IntentRow.revision)).where(IntentRow.revision < before)
    )
    return found


async def pin_regions(session: AsyncSession, revision: int) -> None:
    """Every region without a holding holds `revision` from now on (a region created while a
    rollout runs, or after one was rolled back, must not take the intent that was refused)."""
    regions = (await session.scalars(select(RegionRow.name))).all()
    if regions:
        stmt = pg_insert(HoldingRow).values(
            [{"target": f"region:{r}", "revision": revision} for r in regions]
        )
        await session.execute(stmt.on_conflict_do_nothing(index_elements=[HoldingRow.target]))


async def hold(session: AsyncSession, targets: list[str], revision: int) -> None:
    """These targets hold `revision`; a region's nodes follow their region."""
    regions = [t.removeprefix("region:") for t in targets if t.startswith("region:")]
    if regions:
        nodes = select(NodeRow.name).join(RegionRow).where(RegionRow.name.in_(regions))
        names = [f"node:{n}" for n in (await session.scalars(nodes)).all()]
        await session.execute(delete(HoldingRow).where(HoldingRow.target.in_(names)))
    if targets:
        stmt = pg_insert(HoldingRow).values(
            [{"target": t, "revision": revision} for t in sorted(set(targets))]
        )
        await session.execute(
            stmt.on_conflict_do_update(
                index_elements=[HoldingRow.target], set_={"revision": stmt.excluded.revision}
            )
        )


async def release(session: AsyncSession) -> None:
    """Every target holds the newest intent."""
    await session.execute(delete(HoldingRow))


async def roll_back(session: AsyncSession, base: int) -> None:
    """Every target holds `base` again."""
    await session.execute(delete(HoldingRow))
    await pin_regions(session, base)


async def read_holdings(session: AsyncSession) -> Holdings:
    rows = await session.execute(select(HoldingRow.target, HoldingRow.revision))
    return Holdings.of([(t, r) for t, r in rows])


async def read_intents(session: AsyncSession, revisions: set[int]) -> dict[int, Intent]:
    if not revisions:
        return {}
    rows = await session.execute(
        select(IntentRow.revision, IntentRow.doc).where(IntentRow.revision.in_(revisions))
    )
    return {revision: Intent.parse(revision, doc) for revision, doc in rows}
