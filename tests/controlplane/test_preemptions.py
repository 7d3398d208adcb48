"""A spot preemption notice in a node's heartbeat, against PostgreSQL: the leader sets the node
draining under a revision, once, audited with the notice, and the node's engines are placed
on the region's other node."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update

from controlplane.db.agent_rows import NodeTelemetryRow
from controlplane.db.fleet_rows import NodeRow
from controlplane.services.fleet_state import load_fleet_state
from controlplane.services.preemptions import Preemptions
from tests.kits.controlplane import Api
from tests.kits.fleet_docs import BASE

GPU = {"model": "H100-SXM-80GB", "memory_gb": 80}


def _two_nodes() -> dict[str, Any]:
    return {
        **BASE,
        "nodes": [{"name": f"east-{i}", "region": "us-east", "hostname": f"10.0.0.{i + 1}",
                   "gpus": [{"index": 0, **GPU}]} for i in range(2)],
        "deployments": [{"name": "llama-east", "model": "llama-8b", "region": "us-east",
                         "replicas": 1}],
    }  # fmt: skip


async def test_a_notice_moves_the_nodes_engines_to_the_regions_other_node(api: Api) -> None:
    assert (await api.client.post("/v1/apply", json=_two_nodes())).status_code == 200
    before = await load_fleet_state(api.db)
    (slot,) = before.slots.values()
    assert slot.node == "east-0"
    async with api.db.sessions() as session, session.begin():
        node = await session.scalar(select(NodeRow.id).where(NodeRow.name == "east-0"))
        await session.execute(update(NodeRow).values(health="up"))
        deadline = (datetime.now(UTC) + timedelta(seconds=120)).isoformat()
        session.add(NodeTelemetryRow(node_id=node, observed_at=datetime.now(UTC), data={
            "preemption": {"source": "aws", "deadline": deadline}}))  # fmt: skip
    assert await Preemptions(api.db).tick() == ["east-0"]
    assert await Preemptions(api.db).tick() == []  # once
    after = await load_fleet_state(api.db)
    (moved,) = after.slots.values()
    assert moved.node == "east-1"
    assert str(after.nodes["east-0"].state) == "draining"
    events = (await api.client.get("/v1/audit-events", params={"kind": "node"})).json()["items"]
    assert events[0]["principal"] == "preemption"
    assert "preemption notice (aws)" in events[0]["after"]["reason"]
