"""What an operator does to the newest rollout (pause, resume, promote, abort), and what
the API and the status page show of rollouts."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from controlplane.db.engine import Database
from controlplane.db.fleet_rows import NodeRow, RegionRow
from controlplane.db.rollout_rows import IntentRow, RolloutRow
from controlplane.errors import RolloutNotActive
from controlplane.services.fleet_state import read_fleet_state
from controlplane.services.rollouts import store
from controlplane.services.rollouts.driver import RolloutDriver, audit, bump
from controlplane.services.rollouts.readings import nodes_of, read_nodes
from controlplane.services.rollouts.store import ACTIVE, HELD_BACK, State
from controlplane.services.unit import current_revision


class Operator:
    """What an operator may do to the newest rollout: pause, resume, promote, abort."""

    def __init__(self, driver: RolloutDriver) -> None:
        self._driver = driver

    async def act(self, action: str, actor: str, *, everywhere: bool = False) -> int:
        """The rollout's id; raises RolloutNotActive when none runs (or, for resume, none is
        paused)."""
        driver, revision = self._driver, None
        async with driver.db.sessions() as session, session.begin():
            await store.serialize(session)
            row = await store.latest(session, lock=True)
            if row is None or State(row.state) not in ACTIVE:
                raise RolloutNotActive(
                    "no rollout is running; `meridian rollout status` shows the last"
                )
            now = driver.clock()
            if action == "pause":
                row.state, row.reason = State.PAUSED, f"paused by {actor}"
            elif action == "resume":
                if row.state != State.PAUSED:
                    raise RolloutNotActive(f"rollout {row.id} is not paused")
                row.state, row.reason = State.ROLLING, ""
                if row.wave >= 0:  # the wave's watch begins again: nothing is judged on less
                    state = await read_fleet_state(session)
                    names = nodes_of(state, [t for w in row.waves for t in w["targets"]])
                    readings = await read_nodes(session, names)
                    row.at_wave = {n: r.as_json() for n, r in readings.items()}
                    row.wave_started_at = now
            elif action == "abort":
                row.state, row.reason = State.ABORTED, f"aborted by {actor}"
                row.finished_at = now
                await store.roll_back(session, row.base)
                driver.observe("outcome", {"outcome": str(row.state)})
                revision = await bump(session, "abort", row, {"to": row.base}, actor)
            elif action == "promote":
                revision = await driver.promote(session, row, actor, everywhere=everywhere)
            if action in ("pause", "resume"):
                await audit(session, action, row, {"reason": row.reason}, actor)
            row.updated_at = now
            rollout = row.id
        await driver.feed.published(revision)
        return rollout


async def view(db: Database, *, recent: int = 10) -> dict[str, Any]:
    """Declared and in force, side by side: the newest rollout with its waves and checks,
    what every target holds, and the rollouts before it."""
    async with db.sessions() as session:
        declared = await current_revision(session)
        intent = await session.scalar(select(func.max(IntentRow.revision)))
        rows = (
            await session.scalars(select(RolloutRow).order_by(RolloutRow.id.desc()).limit(recent))
        ).all()
        holdings = await store.read_holdings(session)
        nodes = (await session.execute(select(NodeRow).order_by(NodeRow.name))).unique()
        regions = (await session.scalars(select(RegionRow.name).order_by(RegionRow.name))).all()
        node_rows = list(nodes.scalars())
    targets = []
    for region in regions:
        members = [n for n in node_rows if n.region.name == region]
        targets.append({
            "region": region,
            "holds": holdings.regions.get(region, intent),
            "nodes": [{"name": n.name, "holds": holdings.of_node(n.name, region) or intent,
                       "applied_revision": n.applied_revision, "health": n.health}
                      for n in members],
        })  # fmt: skip
    newest = rows[0] if rows else None
    return {
        "declared_revision": declared,
        "declared_intent": intent,
        "in_force": _in_force(newest, intent),
        "rollout": _rollout(newest) if newest is not None else None,
        "targets": targets,
        "recent": [_rollout(r, brief=True) for r in rows[1:]],
    }


def _in_force(row: RolloutRow | None, intent: int | None) -> dict[str, Any]:
    """In a sentence's worth: the intent in force everywhere, and why it is not the declared."""
    if row is None or State(row.state) in (State.COMPLETE, State.IMMEDIATE, State.SUPERSEDED):
        return {"intent": intent, "why": "the declared intent is in force everywhere"}
    if State(row.state) in HELD_BACK:
        verb = "rolled back" if row.state == State.ROLLED_BACK else "aborted"
        return {"intent": row.base, "why": f"revision {row.revision} was {verb}: {row.reason}"}
    return {"intent": row.base, "why": f"revision {row.revision} is rolling out ({row.state})"}


def _rollout(row: RolloutRow, *, brief: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": row.id, "revision": row.revision, "base": row.base, "state": row.state,
        "actor": row.actor, "reason": row.reason, "created_at": row.created_at,
        "finished_at": row.finished_at,
    }  # fmt: skip
    if brief:
        return out
    waves = []
    for index, wave in enumerate(row.waves):
        status = "done" if index < row.wave else "pending"
        if index == row.wave:
            status = "done" if row.state == State.COMPLETE else str(row.state)
        if State(row.state) in HELD_BACK and index <= row.wave:
            status = "rolled_back"
        waves.append({**wave, "status": status})
    return {**out, "wave": row.wave, "wave_started_at": row.wave_started_at, "waves": waves,
            "checks": row.checks, "policy": row.policy}  # fmt: skip
