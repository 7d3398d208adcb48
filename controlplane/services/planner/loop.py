"""The capacity planner in the leader: every period it reads the live nodes' heartbeats and
the fleet, plans (core.plan), and, in `act` mode and not paused, writes the engine counts it
decided as a fact (`engine_plans`) under a new revision, which every target gets at once: a
scale-up is not a config risk and waits on no rollout wave. A scale-down is the same write;
the agents drain the engines that leave, and migration carries their streams.

Every change decided is audited with its reason and figures: those made under their
revision (kind `engine-plan`), and those not made (`advise` mode, paused, held by a guard or
a budget) under the current one (kind `planner`), once for as long as they stay the same.
What it last decided, with the daily shapes it learned, is kept in `planner_state` for every
replica's API and for the next leader.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.audit_rows import AuditEventRow
from controlplane.db.engine import Database
from controlplane.db.fleet_rows import DeploymentRow, NodeRow
from controlplane.db.planner_rows import EnginePlanRow, PlannerStateRow
from controlplane.domain import NodeState, PlannerMode
from controlplane.services.fleet_state import ENGINE_PLAN, FleetReader
from controlplane.services.placements import commit
from controlplane.services.planner.core import (
    DailyShape,
    Decision,
    Deployment,
    Guards,
    plan,
)
from controlplane.services.planner.demand import DemandTracker
from controlplane.services.planner.inputs import (
    autoscaled,
    heartbeats,
    plans_changed_at,
    routing_slos,
)
from controlplane.services.planner.pools import PoolKeeper, PoolOutcome
from controlplane.services.preemptions import set_states
from controlplane.services.revisions import RevisionFeed
from controlplane.services.unit import UnitOfWork, current_revision
from controlplane.settings import Settings
from controlplane.snapshot.types import FleetState

log = logging.getLogger(__name__)

ACTOR = "planner"
KIND = "planner"  # the audit's kind for what it decided and did not do, and pause/resume
SHAPE_BUCKETS = 96  # a day in quarters of an hour


@dataclass(frozen=True)
class PlannerConfig:
    mode: PlannerMode = PlannerMode.ACT
    period_s: float = 30.0
    cooldown_s: float = 300.0
    max_changes: int = 10
    gpu_budget: int | None = None
    money_budget: float | None = None
    start_s: float = 60.0
    engine_rps: float = 1.0
    day_s: float = 86_400.0
    stale_after_s: float = 30.0

    @classmethod
    def of(cls, settings: Settings) -> PlannerConfig:
        return cls(
            mode=settings.planner_mode,
            period_s=settings.planner_period_s,
            cooldown_s=settings.planner_cooldown_s,
            max_changes=settings.planner_max_changes,
            gpu_budget=settings.planner_gpu_budget,
            money_budget=settings.planner_money_budget,
            start_s=settings.planner_start_s,
            engine_rps=settings.planner_engine_rps,
            day_s=settings.planner_day_s,
            stale_after_s=max(30.0, 3 * settings.node_down_after_s),
        )


async def _release(session: AsyncSession, released: dict[str, str]) -> int:
    """The nodes (name: pool) whose machines the planner let go, set disabled under a new
    revision: a machine gone leaves no active node for placement to put engines on."""
    rows = await session.execute(
        select(NodeRow.id, NodeRow.name, NodeRow.state)
        .where(NodeRow.name.in_(list(released)), NodeRow.state != NodeState.DISABLED.value)
        .order_by(NodeRow.id).with_for_update()
    )  # fmt: skip
    uow = UnitOfWork(session, ACTOR)
    nodes = {node_id: (name, state, f"its machine was let go: pool {released[name]} shrank")
             for node_id, name, state in rows.all()}  # fmt: skip
    await set_states(uow, nodes, NodeState.DISABLED)
    return await commit(uow) or await current_revision(session)


def key_of(model: str, region: str) -> str:
    return f"{model}@{region}"


class Planner:
    def __init__(
        self,
        db: Database,
        config: PlannerConfig,
        feed: RevisionFeed | None = None,
        clock: Callable[[], float] = time.time,
        observe: Callable[[list[dict[str, Any]]], None] | None = None,
        pools: PoolKeeper | None = None,
    ) -> None:
        self.db = db
        self.pools = pools or PoolKeeper(cooldown_s=config.cooldown_s, clock=clock)
        self.feed = feed
        self.observe = observe or (lambda decisions: None)  # the metrics
        self.config = config
        self.clock = clock
        self.tracker = DemandTracker()
        self.reader = FleetReader()
        self.shapes: dict[tuple[str, str], DailyShape] | None = None  # read on the first run
        self.last_run: float | None = None
        self._audited: dict[str, tuple[int, int, str]] = {}  # deployment: what was said last

    def resign(self) -> None:
        """Another replica leads: what this one tracked goes stale."""
        self.tracker, self.shapes, self.last_run, self._audited = DemandTracker(), None, None, {}
        self.reader = FleetReader()
        self.pools.changed_at = {}

    def soon(self) -> None:
        """Plan at the next tick, not at the period's end: capacity was lost (a preemption
        notice), and what covered for it elsewhere must grow back now."""
        self.last_run = None

    async def tick(self) -> list[Decision] | None:
        """Plan if a period has passed since the last plan; None when it did not plan."""
        now = self.clock()
        if self.config.mode is PlannerMode.OFF:
            return None
        if self.last_run is not None and now - self.last_run < self.config.period_s:
            return None
        self.last_run = now
        return await self.run(now)

    async def run(self, now: float) -> list[Decision]:
        async with self.db.sessions() as session, session.begin():
            # one snapshot for the revision and the rows (FleetReader's terms)
            await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            row = await state_row(session, lock=True)
            state = await self.reader.read(session)  # only what changed since the last run
            beats = await heartbeats(session)
            changed_at = await plans_changed_at(session)
            if self.shapes is None:
                self.shapes = _shapes(row.shapes, self.config.day_s)
            scaled = autoscaled(state, beats, changed_at, self.config.start_s)
            self.tracker.forget({b.node for b in beats})
            observed = self.tracker.observe(
                now, beats, routing_slos(state),
                {(d.model, d.region): (d.limits.target, d.max_running) for d in scaled.values()},
            )  # fmt: skip
            for key, seen in observed.items():
                if seen.rates:
                    shape = self.shapes.get(key) or DailyShape.empty(
                        self.config.day_s, SHAPE_BUCKETS
                    )
                    self.shapes[key] = shape.learn(now, seen.rates[-1][1])
            decisions = plan(scaled.values(), observed, self.shapes, self._guards(now))
            acting = self.config.mode is PlannerMode.ACT and not row.paused
            names = {(d.model, d.region): name for name, d in state.deployments.items()}
            if acting:
                revision = await self._act(session, decisions, names, now)
            else:
                revision = None
            await self._audit(session, decisions, names, acting)
            row.last_run_at = datetime.fromtimestamp(now, UTC)
            row.last_run_revision = revision or await current_revision(session)
            row.decisions = [_as_json(d, names, scaled, observed.get((d.model, d.region)))
                             for d in decisions]  # fmt: skip
            shown = list(row.decisions)
            row.shapes = {key_of(*k): list(s.rates) for k, s in sorted(self.shapes.items())}
        if self.feed is not None:
            await self.feed.published(revision)
        if acting:  # the fleet as planned now: this period's engine counts in it
            planned = {names[(d.model, d.region)]: d.target for d in decisions if d.change}
            state = state.model_copy(update={"planned": {**state.planned, **planned}})
        await self._keep_pools(state, acting)
        self.observe(shown)
        for d in decisions:
            if d.change:
                log.info("planner%s: %s", "" if acting else " (advice)", d.describe())
        return decisions

    async def _keep_pools(self, state: FleetState, acting: bool) -> None:
        """Each resizable pool's group asked for the machines its region's engines want;
        what was done, or not, audited once while it stays the same."""
        outcomes = await self.pools.keep(state, acting)
        said = [o for o in outcomes if o.done != "holds"
                and self._audited.get(f"pool:{o.decision.pool}") != _said(o)]  # fmt: skip
        if not said:
            return
        released = {node: o.decision.pool for o in said for node in o.released}
        async with self.db.sessions() as session, session.begin():
            if released:  # their machines are gone: out of placement, and why
                revision = await _release(session, released)
            else:
                revision = await current_revision(session)
            for o in said:
                self._audited[f"pool:{o.decision.pool}"] = _said(o)
                session.add(AuditEventRow(
                    revision=revision, principal=ACTOR, action=o.done, kind=KIND,
                    name=o.decision.pool, after=o.as_json() | {"summary": o.decision.describe()},
                ))  # fmt: skip
        if released and self.feed is not None:
            await self.feed.published(revision)
        for o in said:
            log.info("planner: %s (%s%s)", o.decision.describe(), o.done,
                     f": {o.detail}" if o.detail else "")  # fmt: skip

    def _guards(self, now: float) -> Guards:
        c = self.config
        return Guards(now=now, stale_after_s=c.stale_after_s, cooldown_s=c.cooldown_s,
                      max_changes=c.max_changes, gpu_budget=c.gpu_budget,
                      money_budget=c.money_budget, engine_rps_prior=c.engine_rps)  # fmt: skip

    async def _act(
        self,
        session: AsyncSession,
        decisions: list[Decision],
        names: dict[tuple[str, str], str],
        now: float,
    ) -> int | None:
        """The changes taken, as one revision."""
        changes = [Change(names[(d.model, d.region)], d.current, d.target, d.describe(),
                          {"forecast_rps": round(d.forecast_rps, 3),
                           "per_engine_rps": round(d.per_engine_rps, 3)})
                   for d in decisions if d.change]  # fmt: skip
        for change in changes:
            self._audited.pop(change.deployment, None)
        return await write_plans(session, changes, datetime.fromtimestamp(now, UTC))

    async def _audit(
        self,
        session: AsyncSession,
        decisions: list[Decision],
        names: dict[tuple[str, str], str],
        acting: bool,
    ) -> None:
        """The changes not made, under the current revision: once while they stay the same."""
        revision = await current_revision(session)
        for d in decisions:
            name = names[(d.model, d.region)]
            if d.target == d.current or (acting and d.taken):
                self._audited.pop(name, None)
                continue
            action = "hold" if not d.taken else "advise"
            said = (d.current, d.target, action)
            if self._audited.get(name) == said:
                continue
            self._audited[name] = said
            session.add(AuditEventRow(
                revision=revision, principal=ACTOR, action=action, kind=KIND, name=name,
                after={"engines": d.target, "from": d.current, "reason": d.describe(),
                       "forecast_rps": round(d.forecast_rps, 3)},
            ))  # fmt: skip


@dataclass(frozen=True)
class Change:
    deployment: str
    engines: int  # before
    target: int
    reason: str
    figures: dict[str, float]


async def write_plans(session: AsyncSession, changes: list[Change], at: datetime) -> int | None:
    """Engine counts as a fact, under one new revision (None: nothing to change), each
    audited as kind `engine-plan` with its reason and figures; the slots placed to match."""
    uow = UnitOfWork(session, ACTOR)
    ids = dict((await session.execute(select(DeploymentRow.name, DeploymentRow.id))).all())
    for c in changes:
        uow.record("update", ENGINE_PLAN, c.deployment, {"engines": c.engines},
                   {"engines": c.target, "reason": c.reason, **c.figures})  # fmt: skip
        values = {"deployment_id": ids[c.deployment], "engines": c.target, "changed_at": at,
                  "reason": c.reason}  # fmt: skip
        await session.execute(pg_insert(EnginePlanRow).values(values).on_conflict_do_update(
            index_elements=[EnginePlanRow.deployment_id],
            set_={k: v for k, v in values.items() if k != "deployment_id"},
        ))  # fmt: skip
    return await commit(uow)


async def read_state(session: AsyncSession) -> PlannerStateRow:
    """Its state, read only: as it starts (not paused, nothing planned) before its row is."""
    row = await session.get(PlannerStateRow, 1)
    return row or PlannerStateRow(id=1, paused=False, decisions=[], shapes={})


async def state_row(session: AsyncSession, *, lock: bool = False) -> PlannerStateRow:
    await session.execute(
        pg_insert(PlannerStateRow)
        .values(id=1, paused=False, decisions=[], shapes={})
        .on_conflict_do_nothing(index_elements=[PlannerStateRow.id])
    )
    query = select(PlannerStateRow).where(PlannerStateRow.id == 1)
    if lock:
        query = query.with_for_update()
    return (await session.execute(query)).scalar_one()


def _shapes(doc: dict[str, Any], day_s: float) -> dict[tuple[str, str], DailyShape]:
    out = {}
    for key, rates in (doc or {}).items():
        model, _, region = key.rpartition("@")
        if model and region and isinstance(rates, list) and rates:
            out[(model, region)] = DailyShape(day_s, tuple(
                float(r) if r is not None else None for r in rates))  # fmt: skip
    return out


def _said(o: PoolOutcome) -> tuple[int, int, str]:
    return (o.decision.current, o.decision.target, o.done)


def _as_json(
    d: Decision, names: dict[tuple[str, str], str], scaled: dict[str, Deployment], seen: Any
) -> dict[str, Any]:
    name = names[(d.model, d.region)]
    spec = scaled[name]
    return {
        "deployment": name,
        "model": d.model,
        "region": d.region,
        "engines": d.current,
        "target": d.target,
        "taken": d.taken,
        "reason": d.reason,
        "summary": d.describe(),
        "forecast_rps": round(d.forecast_rps, 3),
        "per_engine_rps": round(d.per_engine_rps, 3),
        "rate_rps": round(seen.rates[-1][1], 3) if seen is not None and seen.rates else None,
        "attainment": seen.attainment if seen is not None else None,
        "inflight": seen.inflight if seen is not None else None,
        "cost_per_hour": round(d.target * spec.gpus_per_engine * spec.price_per_gpu_hour, 4),
    }
