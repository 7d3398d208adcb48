"""Where tenants' LoRA adapters stay loaded (issue 45): the leader's plan, from demand.

Every period the leader sums, per region and adapter, the requests a second the region's
gateways saw (their heartbeats), and decides how many of the region's engines of the base
model keep the adapter loaded:

- an adapter in demand (`cold_rps` or more) on its share of the engines, twice over
  (`HEADROOM`), at least one and at most all of them, so that its requests spread as the
  base model's do;
- within the engines' room: each holds `--max-loaded-loras` adapters (or, unset,
  `--max-loras-per-batch`, SGLang's default 8), the busiest adapters served first;
- what room is left keeps the others loaded on one engine each, those with some demand first,
  so that a newly registered adapter is warm before its first request; those it cannot hold
  are on none, and the engine a request goes to loads it then. An engine's room is what it
  holds less a few places kept for such loads (`planned_slots`, shared with the agents, which
  place the plan by it).

A plan grows at once and shrinks only once demand has fallen well below what it was sized
for (`KEEP`) and stayed there for `SHRINK_AFTER` periods (traffic that pauses between bursts
unloads nothing), so that it does not flap. What changed is written as a fact
(`adapter_plans`) under one new revision, audited with its reason and figures; every target
gets it at once, as it gets the engine plans. The agents choose which engines, all alike
(agents/adapters/keeper.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from meridian_pb.fleet.v1.adapters import planned_slots
from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.engine import Database
from controlplane.db.fleet_rows import AdapterRow, RegionRow
from controlplane.db.planner_rows import AdapterPlanRow
from controlplane.domain import EngineBackend, PdMode
from controlplane.services.fleet_state import ADAPTER_PLAN, FleetReader
from controlplane.services.placements import commit
from controlplane.services.planner.demand import Heartbeat
from controlplane.services.planner.inputs import heartbeats
from controlplane.services.revisions import RevisionFeed
from controlplane.services.unit import UnitOfWork
from controlplane.snapshot.placement import engines as unified_engines
from controlplane.snapshot.types import FleetState

log = logging.getLogger(__name__)
ACTOR = "residency"
HEADROOM = 2.0
KEEP = 0.5  # a plan shrinks once its demand is under this share of what would keep it
SLOTS_DEFAULT = 8  # SGLang's --max-loras-per-batch
SHRINK_AFTER = 6  # periods a smaller plan must be wanted before it is written
WRITE_ROWS = 1000  # plan rows a statement writes


@dataclass(frozen=True)
class Plan:
    adapter: str
    region: str
    engines: int
    rps: float
    reason: str


def engine_slots(engine_args: Mapping[str, object]) -> int:
    """The adapters one engine holds at once, by its arguments."""
    for flag in ("max-loaded-loras", "max-loras-per-batch"):
        value = engine_args.get(flag)
        if isinstance(value, int | str) and str(value).isdigit() and int(value) > 0:
            return int(value)
    return SLOTS_DEFAULT


def demand(beats: Iterable[Heartbeat]) -> dict[tuple[str, str], float]:
    """Requests a second per (adapter, region), summed over the region's gateways."""
    out: dict[tuple[str, str], float] = {}
    for beat in beats:
        for seen in beat.telemetry.get("adapters", []):
            key = (str(seen.get("name", "")), beat.region)
            out[key] = out.get(key, 0.0) + float(seen.get("requests_per_second", 0.0))
    return out


def declared_engines(state: FleetState) -> dict[tuple[str, str], int]:
    """Engines per (model, region) that may serve a request: as the fleet declares them (the
    planner's count for an autoscaled deployment; a disaggregated one's decode engines), not
    as they happen to be ready, so that an engine restarting moves no adapter."""
    out: dict[tuple[str, str], int] = {}
    for name, d in state.deployments.items():
        if d.backend is EngineBackend.EXTERNAL:
            count = len(d.external_urls)
        elif d.pd_mode is PdMode.DISAGGREGATED:
            count = d.decode_replicas
        else:
            count = unified_engines(d, state.planned.get(name))
        out[(d.model, d.region)] = out.get((d.model, d.region), 0) + count
    return out


def plan(
    state: FleetState,
    rates: Mapping[tuple[str, str], float],
    engines_of: Mapping[tuple[str, str], int],
    current: Mapping[tuple[str, str], int],
    cold_rps: float,
) -> list[Plan]:
    """What changes, per (adapter, region) whose plan is not `current`'s; only in the regions
    `engines_of` names (those whose agents report: a region none of whose agents is up keeps
    its plan, and a fleet without agents gets none)."""
    slots: dict[tuple[str, str], int] = {}
    for d in state.deployments.values():
        key = (d.model, d.region)
        slots[key] = max(slots.get(key, 0), engine_slots(d.engine_args))
    out = []
    planned_regions = {region for _, region in engines_of}
    for region in sorted(state.regions):
        if region not in planned_regions:
            continue  # no agent of it reports: its plan stays as it is
        by_model: dict[str, list[str]] = {}
        for name, adapter in state.adapters.items():
            if reaches(state, name, region):
                by_model.setdefault(adapter.base_model, []).append(name)
        for model, names in sorted(by_model.items()):
            engines = engines_of.get((model, region), 0)
            room = engines * planned_slots(slots.get((model, region), SLOTS_DEFAULT))
            wants = _by_demand(names, region, rates, current, engines, room, cold_rps)
            spare = room - sum(w for w, _ in wants.values())
            for name in sorted(names, key=lambda n: (-rates.get((n, region), 0.0), n)):
                want, why = wants[name]
                if want == 0 and spare > 0 and engines > 0:  # room to keep it warm
                    want, why, spare = 1, f"room to keep it loaded in {region}", spare - 1
                if want != current.get((name, region), 0):
                    out.append(Plan(name, region, want, rates.get((name, region), 0.0), why))
    return out


def _by_demand(
    names: list[str],
    region: str,
    rates: Mapping[tuple[str, str], float],
    current: Mapping[tuple[str, str], int],
    engines: int,
    room: int,
    cold_rps: float,
) -> dict[str, tuple[int, str]]:
    """Each adapter's engines by its demand, the busiest first while room lasts, and why."""
    total = sum(rates.get((n, region), 0.0) for n in names)
    out = {}
    for name in sorted(names, key=lambda n: (-rates.get((n, region), 0.0), n)):
        rps, was = rates.get((name, region), 0.0), current.get((name, region), 0)
        want = _wanted(rps, total, engines, cold_rps)
        if want < was and _wanted(rps / KEEP, total, engines, cold_rps) >= was:
            want = min(was, engines)  # not far enough down to shrink
        want = min(want, room)
        room -= want
        share = rps / total if total else 0.0
        out[name] = (want, f"{rps:.2f} requests/s, {share:.0%} of its base model's adapters' "
                           f"in {region}, over {engines} engine(s)")  # fmt: skip
    return out


def reaches(state: FleetState, adapter: str, region: str) -> bool:
    """Some tenant that may use the adapter may be served in the region (as the compiler
    decides what reaches a region's snapshot)."""
    jurisdiction = state.regions[region].jurisdiction
    return any(
        (tenant := state.tenants.get(t)) is not None
        and (tenant.allowed_jurisdictions is None or jurisdiction in tenant.allowed_jurisdictions)
        for t in state.adapters[adapter].tenants
    )


def _wanted(rps: float, total: float, engines: int, cold_rps: float) -> int:
    if rps < cold_rps or engines == 0 or total <= 0:
        return 0
    return max(1, min(engines, math.ceil(engines * rps / total * HEADROOM)))


class Residency:
    def __init__(
        self,
        db: Database,
        period_s: float = 5.0,
        cold_rps: float = 0.02,
        feed: RevisionFeed | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db, self.period_s, self.cold_rps, self.feed, self.clock = (
            db, period_s, cold_rps, feed, clock,
        )  # fmt: skip
        self.reader = FleetReader()
        self.last_run: float | None = None
        self.shrinking: dict[tuple[str, str], float] = {}  # since when a smaller plan is wanted
        self.planned_for: tuple[int, datetime | None] | None = None  # _adapters_mark's

    async def tick(self) -> list[Plan] | None:
        """Plans every `period_s`, and at once when adapters were registered, changed or
        removed since the last plan (a new adapter is warm seconds after its apply)."""
        now = self.clock()
        if self.last_run is not None and now - self.last_run < self.period_s:
            async with self.db.sessions() as session:
                if await _adapters_mark(session) == self.planned_for:
                    return None
        self.last_run = now
        async with self.db.sessions() as session, session.begin():
            await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            self.planned_for = await _adapters_mark(session)
            state = await self.reader.read(session)
            beats = await heartbeats(session)
            current = {(a, r): n for a, regions in state.resident.items()
                       for r, n in regions.items()}  # fmt: skip
            live = {beat.region for beat in beats}  # regions whose agents report
            engines_of = {k: n for k, n in declared_engines(state).items() if k[1] in live}
            changes = self._held(
                plan(state, demand(beats), engines_of, current, self.cold_rps), current, now
            )
            if not changes:
                return changes
            revision = await self._write(session, changes, datetime.fromtimestamp(now, UTC))
        if self.feed is not None:
            await self.feed.published(revision)
        for change in changes:
            log.info("adapter %s in %s: %d engine(s) (%s)", change.adapter, change.region,
                     change.engines, change.reason)  # fmt: skip
        return changes

    def _held(
        self, changes: list[Plan], current: Mapping[tuple[str, str], int], now: float
    ) -> list[Plan]:
        """The changes to write now: growth at once, a shrink once it has been wanted for
        `SHRINK_AFTER` periods in a row (a new leader starts counting afresh)."""
        out, shrinking = [], {}
        for c in changes:
            key = (c.adapter, c.region)
            if c.engines < current.get(key, 0):
                since = shrinking[key] = self.shrinking.get(key, now)
                if now - since < SHRINK_AFTER * self.period_s:
                    continue
                del shrinking[key]
            out.append(c)
        self.shrinking = shrinking
        return out

    async def _write(self, session: AsyncSession, changes: list[Plan], at: datetime) -> int | None:
        uow = UnitOfWork(session, ACTOR)
        adapters = dict((await session.execute(select(AdapterRow.name, AdapterRow.id))).all())
        regions = dict((await session.execute(select(RegionRow.name, RegionRow.id))).all())
        rows = []
        for c in changes:
            if c.adapter not in adapters or c.region not in regions:
                continue
            uow.record("update", ADAPTER_PLAN, c.adapter, None,
                       {"region": c.region, "engines": c.engines, "requests_per_second":
                        round(c.rps, 3), "reason": c.reason})  # fmt: skip
            rows.append({"adapter_id": adapters[c.adapter], "region_id": regions[c.region],
                         "engines": c.engines, "changed_at": at, "reason": c.reason})  # fmt: skip
        for start in range(0, len(rows), WRITE_ROWS):  # one statement a chunk, not one a row
            insert = pg_insert(AdapterPlanRow).values(rows[start : start + WRITE_ROWS])
            await session.execute(insert.on_conflict_do_update(
                index_elements=[AdapterPlanRow.adapter_id, AdapterPlanRow.region_id],
                set_={k: insert.excluded[k] for k in ("engines", "changed_at", "reason")},
            ))  # fmt: skip
        return await commit(uow)


async def _adapters_mark(session: AsyncSession) -> tuple[int, datetime | None]:
    """What changes whenever an adapter is registered, changed or removed."""
    count, newest = (
        await session.execute(select(func.count(), func.max(AdapterRow.updated_at)))
    ).one()
    return int(count), newest
