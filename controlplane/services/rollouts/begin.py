"""The writer's side: a commit that changes the intent starts a rollout, in its transaction.

Before the transaction commits, every region that holds no revision yet is pinned to the last
good intent, so that no replica's push hub can send the new intent anywhere before the
rollout's first wave. The leader's driver takes it from there. Under `strategy: immediate`
the change goes everywhere with the commit, as it did before rollouts existed.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.rollout_rows import IntentRow, RolloutRow
from controlplane.schemas.rollout import Strategy
from controlplane.services.fleet_state import read_fleet_state
from controlplane.services.rollouts import store
from controlplane.services.rollouts.compose import INTENT_KEYS, INTENT_KINDS, intent_doc
from controlplane.services.rollouts.store import ACTIVE, HELD_BACK, State
from controlplane.services.unit import UnitOfWork, current_revision


async def on_commit(uow: UnitOfWork, revision: int) -> None:
    session = uow.session
    newest = await store.latest(session, lock=True)
    if not any(change.kind in INTENT_KINDS for change in uow.changes):
        if newest is not None and State(newest.state) in ACTIVE | HELD_BACK:
            await store.pin_regions(session, newest.base)  # a region created meanwhile
        return
    await session.flush()
    state = await read_fleet_state(session, INTENT_KEYS)
    session.add(IntentRow(revision=revision, doc=intent_doc(state)))
    base = await store.last_good(session, newest, revision)
    if newest is not None and State(newest.state) in ACTIVE:
        newest.state, newest.reason = State.SUPERSEDED, f"revision {revision} took its place"
        newest.finished_at = func.now()
    policy = await store.policy(session)
    immediate = policy.strategy is Strategy.IMMEDIATE or base is None
    if immediate:
        await store.release(session)
    else:
        assert base is not None
        await store.pin_regions(session, base)
    session.add(
        RolloutRow(
            revision=revision,
            base=base if base is not None else revision,
            state=State.IMMEDIATE if immediate else State.ROLLING,
            actor=uow.actor,
            policy=policy.model_dump(mode="json"),
            waves=[],
            wave=-1,
            before={},
            at_wave={},
            checks=[],
            reason=(
                "the rollout policy's strategy is immediate"
                if policy.strategy is Strategy.IMMEDIATE
                else "the fleet's first intent: nothing was in force to protect"
                if base is None
                else ""
            ),
        )
    )
    await session.flush()


async def seed_intent(session: AsyncSession) -> None:
    """At start: the intent in force, recorded once, so that the first change after an
    upgrade has a last good revision to start from."""
    if await session.scalar(select(IntentRow.revision).limit(1)) is not None:
        return
    state = await read_fleet_state(session, INTENT_KEYS)
    if any(getattr(state, key) for key in INTENT_KEYS):
        session.add(IntentRow(revision=await current_revision(session), doc=intent_doc(state)))
