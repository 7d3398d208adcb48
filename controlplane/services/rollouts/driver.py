"""The leader's loop over the newest rollout: begin it, watch each wave, advance, roll back.

Each tick is one transaction that locks the rollout's row, so the writers (which supersede
it) and the operators (pause, promote, abort) are ordered with it; everything it decides is
written before it is announced. A new leader reads the row and goes on from there: a wave's
counters as it began are in the row, so no check restarts from nothing or is skipped, and a
target never goes backwards except by a rollback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.audit_rows import AuditEventRow
from controlplane.db.engine import Database
from controlplane.db.rollout_rows import RolloutRow
from controlplane.schemas.rollout import RolloutPolicySpec
from controlplane.services.fleet_state import read_fleet_state
from controlplane.services.placements import commit
from controlplane.services.revisions import RevisionFeed
from controlplane.services.rollouts import store
from controlplane.services.rollouts.compose import Intent
from controlplane.services.rollouts.counts import Counts, Reading, total
from controlplane.services.rollouts.judge import Check, Sides, judge_nodes, judge_traffic
from controlplane.services.rollouts.readings import (
    node_views,
    nodes_of,
    read_nodes,
    read_nodes_at,
    regions_of,
)
from controlplane.services.rollouts.store import ACTIVE, State
from controlplane.services.rollouts.waves import Wave, affected, plan
from controlplane.services.unit import UnitOfWork, current_revision

log = logging.getLogger(__name__)
ACTOR = "rollout"


def utc_now() -> datetime:
    return datetime.now(UTC)


class RolloutDriver:
    def __init__(
        self,
        db: Database,
        feed: RevisionFeed,
        *,
        observe: Callable[[str, dict[str, Any]], None] | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.db = db
        self.feed = feed
        self.observe = observe or (lambda event, detail: None)
        self.clock = clock

    async def tick(self) -> None:
        revision = None
        async with self.db.sessions() as session, session.begin():
            await store.serialize(session)
            row = await store.latest(session, lock=True)
            if row is None or State(row.state) not in ACTIVE:
                return
            if row.wave < 0:
                if row.state == State.PAUSED:
                    return  # paused before it began: it begins when resumed
                revision = await self._begin(session, row)
            else:
                revision = await self._watch(session, row)
        await self.feed.published(revision)

    async def _begin(self, session: AsyncSession, row: RolloutRow) -> int | None:
        now = self.clock()
        state = await read_fleet_state(session)
        intents = await store.read_intents(session, {row.base, row.revision})
        policy = RolloutPolicySpec.model_validate(row.policy)
        regions = affected(state, intents.get(row.base), intents[row.revision])
        waves = plan(policy, state, regions)
        changed = regions  # region: the models whose desired state it changes
        row.waves = [w.model_dump() for w in waves]
        if not waves:
            await self._finish(session, row, "no region's snapshot changes")
            return None
        names = nodes_of(state, [t for w in waves for t in w.targets])
        readings = await read_nodes(session, names)
        earlier = await read_nodes_at(session, names, now - timedelta(seconds=policy.bake_s))
        row.before = {
            n: {m: c.as_json() for m, c in r.minus(earlier.get(n)).items()}
            for n, r in readings.items()
            if n in earlier
        }
        said = "; ".join(f"{r}: {', '.join(m) or 'no model'}" for r, m in changed.items())
        log.info("rollout %s of revision %s: %d waves; it changes %s", row.id, row.revision,
                 len(waves), said)  # fmt: skip
        await audit(session, "begin", row, {"changes": changed})
        return await self._advance(session, row, 0, readings, now)

    async def _advance(
        self,
        session: AsyncSession,
        row: RolloutRow,
        index: int,
        readings: dict[str, Reading],
        now: datetime,
    ) -> int | None:
        wave = Wave.model_validate(row.waves[index])
        if row.wave_started_at is not None and row.wave >= 0:
            self.observe("wave", {"seconds": (now - row.wave_started_at).total_seconds()})
        await store.hold(session, wave.targets, row.revision)
        row.wave, row.wave_started_at, row.updated_at = index, now, now
        row.at_wave = {n: r.as_json() for n, r in readings.items()}
        row.checks = []
        detail = {"wave": wave.name, "targets": wave.targets, "intent": row.revision,
                  "models": wave.models}  # fmt: skip
        row.pushed_revision = await bump(session, "wave", row, detail)
        return row.pushed_revision

    async def _watch(self, session: AsyncSession, row: RolloutRow) -> int | None:
        now = self.clock()
        policy = RolloutPolicySpec.model_validate(row.policy)
        waves = [Wave.model_validate(w) for w in row.waves]
        state = await read_fleet_state(session)
        done = [t for w in waves[: row.wave + 1] for t in w.targets]
        updated = nodes_of(state, done)
        rest = [n for n in nodes_of(state, [t for w in waves for t in w.targets])
                if n not in updated]  # fmt: skip
        readings = await read_nodes(session, updated + rest)
        at_wave = {n: Reading.from_json(doc) for n, doc in row.at_wave.items()}
        regions = regions_of(state, done)
        intents = await store.read_intents(session, {row.revision, row.base})
        intent, base = intents[row.revision], intents.get(row.base)
        sides = Sides(
            updated=total([readings[n].minus(at_wave.get(n)) for n in updated if n in readings]),
            baseline=total([readings[n].minus(at_wave.get(n)) for n in rest if n in readings]),
            before=total(
                [
                    {m: Counts.from_json(c) for m, c in row.before[n].items()}
                    for n in updated
                    if n in row.before
                ]
            ),
            slo_ms=_slos(intent, regions),
        )
        views = await node_views(session, updated, readings)
        # the models these targets served before and serve now must show enough traffic; a
        # model new here is judged when it has some (none can have come to it before)
        served = {d.model for d in intent.deployments.values() if d.region in regions} & {
            d.model for d in (base.deployments.values() if base else []) if d.region in regions
        }
        # only the models the change alters in the regions done are judged on their traffic
        named = [w.models for w in waves[: row.wave + 1]]
        judged = None if None in named else {m for models in named for m in models or ()}
        checks = judge_nodes(policy.checks, views, at_wave)
        checks += judge_traffic(policy.checks, sides, served, judged)
        row.checks, row.updated_at = [c.as_json() for c in checks], now
        failed = [c for c in checks if c.verdict == "fail"]
        if failed:
            return await self._roll_back(session, row, failed)
        if row.state == State.PAUSED or row.wave_started_at is None:
            return None
        elapsed = (now - row.wave_started_at).total_seconds()
        wave = waves[row.wave]
        if elapsed < wave.bake_s:
            return None
        waiting = [c for c in checks if c.verdict == "wait"]
        if not waiting:
            if row.wave + 1 < len(waves):
                return await self._advance(session, row, row.wave + 1, readings, now)
            await self._finish(session, row, "every wave passed its checks")
            return None
        if elapsed >= wave.bake_s + policy.checks.wait_for_traffic_s:
            row.state = State.PAUSED
            said = "; ".join(_said(c) for c in waiting)
            row.reason = f"too little to judge after {elapsed:.0f} s: {said}; promote or abort"
            await audit(session, "pause", row, {"reason": row.reason})
        return None

    async def promote(
        self, session: AsyncSession, row: RolloutRow, actor: str, *, everywhere: bool
    ) -> int | None:
        """The next wave now, without waiting for its bake or checks; or every wave at once."""
        now = self.clock()
        if row.wave < 0:
            await self._begin(session, row)
            if State(row.state) not in ACTIVE:
                return None  # nothing to roll out
        last = len(row.waves) - 1
        if everywhere or row.wave >= last:
            targets = [t for w in row.waves for t in w["targets"]]
            await store.hold(session, targets, row.revision)
            await self._finish(session, row, f"promoted by {actor}")
            return await bump(session, "promote", row, {"everywhere": True}, actor)
        state = await read_fleet_state(session)
        names = nodes_of(state, [t for w in row.waves for t in w["targets"]])
        readings = await read_nodes(session, names)
        await audit(session, "promote", row, {"to wave": row.wave + 1}, actor)
        return await self._advance(session, row, row.wave + 1, readings, now)

    async def _roll_back(self, session: AsyncSession, row: RolloutRow, failed: list[Check]) -> int:
        row.state = State.ROLLED_BACK
        row.reason = "; ".join(_said(c) for c in failed)
        row.finished_at = row.updated_at = self.clock()
        await store.roll_back(session, row.base)
        for check in failed:
            self.observe("rollback", {"check": check.check})
        self.observe("outcome", {"outcome": str(row.state)})
        log.warning("rollout %s of revision %s rolled back: %s", row.id, row.revision, row.reason)
        return await bump(session, "rollback", row, {"to": row.base, "because": row.reason})

    async def _finish(self, session: AsyncSession, row: RolloutRow, why: str) -> None:
        row.state, row.reason = State.COMPLETE, why
        row.finished_at = row.updated_at = self.clock()
        if row.wave_started_at is not None:
            self.observe(
                "wave", {"seconds": (row.finished_at - row.wave_started_at).total_seconds()}
            )
        await store.release(session)
        self.observe("outcome", {"outcome": str(row.state)})
        await audit(session, "complete", row, {"reason": why})
        log.info("rollout %s of revision %s complete", row.id, row.revision)


async def bump(
    session: AsyncSession, action: str, row: RolloutRow, detail: dict[str, Any], actor: str = ACTOR
) -> int:
    """A new revision for what the rollout changed, audited under it."""
    uow = UnitOfWork(session, actor)
    uow.record(action, "rollout", str(row.id), None, detail)
    revision = await commit(uow)
    assert revision is not None
    return revision


async def audit(
    session: AsyncSession, action: str, row: RolloutRow, detail: dict[str, Any], actor: str = ACTOR
) -> None:
    """A step that moves no target: audited under the current revision."""
    revision = await current_revision(session)
    session.add(
        AuditEventRow(revision=revision, principal=actor, action=action, kind="rollout",
                      name=str(row.id), after=detail)
    )  # fmt: skip


def _counts(doc: dict[str, Any]) -> dict[str, Counts]:
    return {model: Counts.from_json(counts) for model, counts in doc.items()}


def _said(check: Check) -> str:
    model = f" of {check.model}" if check.model else ""
    return f"{check.check}{model}: {check.figure}"


def _slos(intent: Intent, regions: set[str]) -> dict[str, tuple[int | None, int | None]]:
    """Per model, the loosest SLO among the updated regions' routes (a region's own policy
    over the model's)."""
    out: dict[str, tuple[int | None, int | None]] = {}
    for model in intent.models:
        policies = [p for p in intent.routing_policies.values() if p.model == model]
        general = next((p for p in policies if p.region is None), None)
        chosen = [next((p for p in policies if p.region == r), general) for r in sorted(regions)]
        ttft = [p.slo_ttft_ms for p in chosen if p is not None and p.slo_ttft_ms is not None]
        itl = [p.slo_itl_ms for p in chosen if p is not None and p.slo_itl_ms is not None]
        out[model] = (max(ttft, default=None), max(itl, default=None))
    return out
