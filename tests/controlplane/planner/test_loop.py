"""The planner in the leader, against PostgreSQL: it reads the live nodes' heartbeats as the
control plane stores them, and in `act` mode writes engine counts that the compiled snapshot
then runs, under a revision with the reason audited; `advise` mode and a pause change
nothing but say what they would do; stale heartbeats hold; the budget caps the fleet."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select, update

from controlplane.db.agent_rows import NodeTelemetryRow
from controlplane.db.audit_rows import AuditEventRow
from controlplane.db.fleet_rows import NodeRow
from controlplane.domain import PlannerMode
from controlplane.services.fleet_state import load_fleet_state
from controlplane.services.planner.loop import Planner, PlannerConfig
from controlplane.snapshot import compile_region
from tests.kits.controlplane import Api
from tests.kits.fleet_docs import BASE

T0 = 1_800_000_000.0
GPU = {"model": "H100-SXM-80GB", "memory_gb": 80}
FLEET: dict[str, Any] = {
    **BASE,
    "node_pools": [{"name": "east-pool", "cloud": "aws", "region": "us-east",
                    "gpu_model": "H100-SXM-80GB", "gpus_per_node": 8,
                    "price_per_gpu_hour": 4.0, "max_nodes": 2}],
    "nodes": [{"name": "east-1", "region": "us-east", "pool": "east-pool",
               "hostname": "10.0.0.11", "gpus": [{"index": i, **GPU} for i in range(8)]}],
    "deployments": [{"name": "llama-east", "model": "llama-8b", "region": "us-east",
                     "autoscale": {"min_replicas": 1, "max_replicas": 6, "headroom": 0.0}}],
}  # fmt: skip
CONFIG = PlannerConfig(period_s=10, cooldown_s=60, start_s=20, engine_rps=2.0)


@pytest.fixture
async def fleet(api: Api) -> Api:
    applied = await api.client.post("/v1/apply", json=FLEET)
    assert applied.status_code == 200, applied.text
    async with api.db.sessions() as session, session.begin():
        await session.execute(update(NodeRow).values(health="up"))
    return api


async def _heartbeat(
    api: Api, at: float, ok_total: int, engines: int = 1, node_name: str = "east-1",
    received_total: int = 0,
) -> None:  # fmt: skip
    """What the node's agent would report: its gateway's answers for the model since it
    started (of which `received_total` to requests a peer region escalated here), and its
    engines."""
    data = {
        "answers": [{"model": "llama-8b", "total_by_code": {"ok": str(ok_total)},
                     "received_by_code": {"ok": str(received_total)}}],
        "engines": [{"id": f"llama-{node_name}/unified-{i}", "model": "llama-8b",
                     "state": "ready", "inflight_requests": 1, "ready_after_s": 20.0}
                    for i in range(engines)],
    }  # fmt: skip
    async with api.db.sessions() as session, session.begin():
        node = await session.scalar(select(NodeRow.id).where(NodeRow.name == node_name))
        when = datetime.fromtimestamp(at, UTC)
        row = await session.get(NodeTelemetryRow, node)
        if row is None:
            session.add(NodeTelemetryRow(node_id=node, observed_at=when, data=data))
        else:
            row.observed_at, row.data = when, data


async def _engines(api: Api, region: str = "us-east") -> int:
    state = await load_fleet_state(api.db)
    snapshot = compile_region(state, region)
    return sum(len(n.engines) for n in snapshot.nodes)


async def _events(api: Api, kind: str) -> list[AuditEventRow]:
    async with api.db.sessions() as session:
        query = select(AuditEventRow).where(AuditEventRow.kind == kind).order_by(AuditEventRow.id)
        return list((await session.execute(query)).scalars())


class Node:
    """One node's agent, heartbeating: its gateway's totals grow by what it is asked."""

    def __init__(self, api: Api) -> None:
        self.api, self.t, self.total, self.received = api, T0, 0, 0

    async def demand(
        self, planner: Planner, rps: float, periods: int, from_peers: bool = False
    ) -> None:
        """`rps` answered a second for some periods (`from_peers`: all of it to requests
        escalated here by a peer region), the planner running after each heartbeat."""
        for _ in range(periods):
            await _heartbeat(self.api, self.t, self.total, await _engines(self.api),
                             received_total=self.received)  # fmt: skip
            await planner.run(self.t + 1)
            self.t += 10
            self.total += int(rps * 10)
            self.received += int(rps * 10) if from_peers else 0


async def test_demand_rising_grows_the_engines_under_a_revision_that_says_why(fleet: Api) -> None:
    planner = Planner(fleet.db, CONFIG)
    assert await _engines(fleet) == 1
    before = await fleet.revision()
    await Node(fleet).demand(planner, rps=7.0, periods=3)
    assert await _engines(fleet) == 4  # 7 rps at 2 rps an engine
    assert await fleet.revision() > before
    (grew, *_) = await _events(fleet, "engine-plan")
    assert grew.principal == "planner"
    assert grew.before == {"engines": 1}
    assert grew.after is not None
    assert grew.after["engines"] == 4
    assert "us-east llama-8b 1→4: forecast 7.0 rps in 20 s" in grew.after["reason"]
    shown = (await fleet.client.get("/v1/deployments/llama-east")).json()
    assert shown["replicas"] == 1  # the declared intent is the operator's; the plan is apart


async def test_work_a_peer_region_escalated_here_is_planned_where_it_was_asked_not_here(
    fleet: Api,
) -> None:
    planner = Planner(fleet.db, CONFIG)
    await Node(fleet).demand(planner, rps=7.0, periods=3, from_peers=True)
    assert await _engines(fleet) == 1  # its own clients asked nothing: its minimum
    (decision,) = (await fleet.client.get("/v1/planner")).json()["decisions"]
    assert decision["forecast_rps"] == 0.0, decision


async def test_advise_mode_and_a_pause_change_nothing_but_say_what_they_would_do(
    fleet: Api,
) -> None:
    advising = Planner(fleet.db, PlannerConfig(**{**CONFIG.__dict__, "mode": PlannerMode.ADVISE}))
    before = await fleet.revision()
    node = Node(fleet)
    await node.demand(advising, rps=7.0, periods=3)
    assert await _engines(fleet) == 1
    assert await fleet.revision() == before
    advice = await _events(fleet, "planner")
    assert [(e.action, e.after and e.after["engines"]) for e in advice] == [("advise", 4)]

    paused = await fleet.client.post("/v1/planner/pause")
    assert paused.status_code == 200, paused.text
    acting = Planner(fleet.db, CONFIG)
    await node.demand(acting, rps=7.0, periods=3)
    assert await _engines(fleet) == 1
    assert (await fleet.client.post("/v1/planner/resume")).status_code == 200
    await node.demand(acting, rps=7.0, periods=1)
    assert await _engines(fleet) == 4


async def test_stale_heartbeats_hold_and_never_scale_down(fleet: Api) -> None:
    planner = Planner(fleet.db, CONFIG)
    node = Node(fleet)
    await node.demand(planner, rps=7.0, periods=3)
    assert await _engines(fleet) == 4
    decided = await planner.run(node.t + 600)  # no heartbeat for ten minutes: a partition
    assert await _engines(fleet) == 4
    assert [d.reason for d in decided] == ["no fresh demand (the last heartbeat is 610 s old)"]


async def test_the_money_budget_is_never_exceeded(fleet: Api) -> None:
    planner = Planner(fleet.db, PlannerConfig(**{**CONFIG.__dict__, "money_budget": 12.0}))
    await Node(fleet).demand(planner, rps=20.0, periods=4)
    assert await _engines(fleet) == 3  # $4 a GPU-hour: 3 engines of one GPU, not 6
    (held, *_) = await _events(fleet, "planner")
    assert held.action == "hold"
    assert held.after is not None
    assert "the budget of 12 an hour" in held.after["reason"]


async def test_demand_moving_from_us_east_to_eu_west_moves_the_engines_with_it(api: Api) -> None:
    west = {"name": "west-1", "region": "eu-west", "hostname": "10.0.1.11",
            "gpus": [{"index": i, **GPU} for i in range(8)]}  # fmt: skip
    deployment = {**FLEET["deployments"][0], "name": "llama-west", "region": "eu-west"}
    doc = {**FLEET, "nodes": [*FLEET["nodes"], west],
           "deployments": [*FLEET["deployments"], deployment]}  # fmt: skip
    assert (await api.client.post("/v1/apply", json=doc)).status_code == 200
    async with api.db.sessions() as session, session.begin():
        await session.execute(update(NodeRow).values(health="up"))
    planner = Planner(api.db, CONFIG)
    t, east_total, west_total = T0, 0, 0
    seen = []
    for period in range(20):  # us-east's evening, then eu-west's morning
        east_rps, west_rps = (7.0, 0.0) if period < 4 else (0.0, 7.0)
        await _heartbeat(api, t, east_total, await _engines(api), "east-1")
        await _heartbeat(api, t, west_total, await _engines(api, "eu-west"), "west-1")
        await planner.run(t + 1)
        seen.append((await _engines(api), await _engines(api, "eu-west")))
        t += 10
        east_total += int(east_rps * 10)
        west_total += int(west_rps * 10)
    assert seen[3] == (4, 1)  # us-east carries it
    assert seen[-1] == (1, 4)  # then eu-west does; us-east down to its minimum
    downs = [b[0] for a, b in itertools.pairwise(seen) if b[0] < a[0]]
    assert downs == [2, 1]  # by halves, a cool-down apart
