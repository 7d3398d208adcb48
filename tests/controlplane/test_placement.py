"""Placement is sticky: engines keep their node, GPUs and port across unrelated changes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from sqlalchemy import delete, func, select

from controlplane.db.engine import Database
from controlplane.db.fleet_rows import EngineSlotRow
from controlplane.services.fleet_state import region_snapshots
from controlplane.services.placements import seed_slots
from tests.kits.controlplane import Api
from tests.kits.fleet_docs import example

H100 = {"model": "H100-SXM-80GB", "memory_gb": 80}


@pytest_asyncio.fixture(loop_scope="session")
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database.connect(database_url, pool_size=2)
    yield database
    await database.close()


async def placed(db: Database, region: str) -> dict[str, tuple[list[int], int]]:
    snapshot = (await region_snapshots(db))[region]
    return {e.id: (e.gpu_indexes, e.port) for n in snapshot.nodes for e in n.engines}


async def test_engines_stay_put_when_deployments_come_and_go(api: Api, db: Database) -> None:
    document = example()
    document["nodes"][2]["gpus"].append({"index": 2, **H100})  # eu-west-1: three GPUs
    response = await api.client.post("/v1/apply", json=document)
    assert response.status_code == 200, response.text
    first = await placed(db, "eu-west")
    assert first == {
        "llama-eu-west/unified-0": ([0], 30000),
        "llama-eu-west/unified-1": ([1], 30001),
    }

    # A deployment whose name sorts first takes what is free, and moves no one.
    await api.create(
        "deployments",
        {"name": "a-qwen-eu-west", "model": "qwen2.5-32b-instruct", "region": "eu-west",
         "backend": "sim"},
    )  # fmt: skip
    second = await placed(db, "eu-west")
    assert second == {**first, "a-qwen-eu-west/unified-0": ([2], 30002)}

    # Taking llama down to one replica frees GPU 1; the others stay where they are.
    current = (await api.client.get("/v1/deployments/llama-eu-west")).headers["ETag"]
    response = await api.client.patch(
        "/v1/deployments/llama-eu-west", json={"replicas": 1}, headers={"If-Match": current}
    )
    assert response.status_code == 200, response.text
    third = await placed(db, "eu-west")
    assert third == {
        "llama-eu-west/unified-0": ([0], 30000),
        "a-qwen-eu-west/unified-0": ([2], 30002),
    }

    # A deleted deployment takes its slots along; a new one reuses the lowest free port.
    response = await api.client.delete(
        "/v1/deployments/a-qwen-eu-west",
        headers={
            "If-Match": (await api.client.get("/v1/deployments/a-qwen-eu-west")).headers["ETag"]
        },
    )
    assert response.status_code == 204, response.text
    current = (await api.client.get("/v1/deployments/llama-eu-west")).headers["ETag"]
    await api.client.patch(
        "/v1/deployments/llama-eu-west", json={"replicas": 3}, headers={"If-Match": current}
    )
    assert await placed(db, "eu-west") == {
        "llama-eu-west/unified-0": ([0], 30000),
        "llama-eu-west/unified-1": ([1], 30001),
        "llama-eu-west/unified-2": ([2], 30002),
    }


async def test_a_database_from_before_slots_keeps_what_agents_run(api: Api, db: Database) -> None:
    document = example()
    document["nodes"][1]["gpus"].append({"index": 1, **H100})  # us-west-1: two GPUs
    assert (await api.client.post("/v1/apply", json=document)).status_code == 200
    running = await placed(db, "us-west")
    assert running == {"llama-us-west/unified-0": ([0], 30000)}
    async with db.sessions() as session, session.begin():
        await session.execute(delete(EngineSlotRow))  # as in a database upgraded to 0003
    await seed_slots(db)  # what a control plane does when it starts
    async with db.sessions() as session:
        assert await session.scalar(select(func.count()).select_from(EngineSlotRow)) == 6
    # A deployment that sorts first takes the free GPU; the running engine stays.
    await api.create(
        "deployments",
        {"name": "a-qwen-us-west", "model": "qwen2.5-32b-instruct", "region": "us-west",
         "backend": "sim"},
    )  # fmt: skip
    assert await placed(db, "us-west") == {**running, "a-qwen-us-west/unified-0": ([1], 30001)}
