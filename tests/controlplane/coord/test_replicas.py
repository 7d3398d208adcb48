"""Two replicas coordinated through a real etcd: fan-out, presence and leader takeover."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio

from agents.control.fleet import spread
from meridian.procs import stop_child
from tests.kits.controlplane import Server, start_server
from tests.kits.push import (
    ADMIN,
    Agent,
    bootstrap_token,
    eventually,
    get,
    patch,
    seed,
)
from tests.kits.services import running_etcd

_prefixes = itertools.count()


@pytest_asyncio.fixture(loop_scope="session")
async def replicas(database_url: str, etcd: str) -> AsyncIterator[list[Server]]:
    """Two `serve` processes on one database and one etcd, under a key prefix of their own."""
    env = {
        "etcd_endpoints": etcd,
        "etcd_prefix": f"/test-{os.getpid()}-{next(_prefixes)}",
        "lease_ttl_s": "3",
        "node_down_after_s": "2",
    }
    started = await asyncio.gather(*(start_server(database_url, **env) for _ in range(2)))
    try:
        await seed(started[0].url)
        yield list(started)
    finally:
        await asyncio.gather(*(stop_child(s.process) for s in started))


async def cluster(server: Server) -> dict[str, Any]:
    doc: dict[str, Any] = await get(server.url, "/v1/cluster")
    return doc


async def agreed_leader(servers: list[Server]) -> str:
    async def probe() -> str | None:
        views = [await cluster(s) for s in servers]
        leaders = {v["leader"] for v in views}
        full = all(len(v["replicas"]) == len(servers) for v in views)
        return leaders.pop() if len(leaders) == 1 and None not in leaders and full else None

    leader: str = await eventually(probe, within_s=15)
    return leader


async def connected(server: Server, region: str) -> Agent:
    agent = Agent(server.grpc_target, region)
    await agent.register(await bootstrap_token(server.url, region))
    await agent.connect()
    await agent.apply(await agent.next())
    return agent


async def test_a_change_through_either_replica_reaches_the_agents_of_both(
    replicas: list[Server],
) -> None:
    a, b = replicas
    await agreed_leader(replicas)
    ids = {(await cluster(s))["self"] for s in replicas}
    assert {r["id"] for r in (await cluster(a))["replicas"]} == ids

    on_a, on_b = await connected(a, "eu-west"), await connected(b, "us-east")
    try:
        # Tenant acme may use every region, so a change to it reaches both agents.
        for through, quota in ((a, 50_000), (b, 90_000)):
            before = {agent.region: agent.revision for agent in (on_a, on_b)}
            await patch(through.url, "/v1/tenants/acme", {"requests_per_minute": quota})
            for agent in (on_a, on_b):
                snapshot = await agent.next(within_s=5)
                assert snapshot.revision > before[agent.region]
                acme = next(t for t in snapshot.tenants if t.name == "acme")
                assert 0 < acme.requests_per_minute <= quota
                await agent.apply(snapshot)
    finally:
        await on_a.close()
        await on_b.close()


async def test_killing_the_leader_hands_the_singletons_over_and_agents_resume(
    replicas: list[Server],
) -> None:
    leader_id = await agreed_leader(replicas)
    views = {(await cluster(s))["self"]: s for s in replicas}
    leader, survivor = views[leader_id], next(s for i, s in views.items() if i != leader_id)

    resuming = await connected(leader, "us-east")  # will move to the survivor
    lost = await connected(leader, "us-west")  # will not come back
    steady = await connected(survivor, "eu-west")
    try:

        async def all_up() -> bool:
            nodes = [await get(leader.url, f"/v1/nodes/{a.node}") for a in (resuming, lost)]
            return all(node["status"]["health"] == "up" for node in nodes)

        await eventually(all_up)  # the leader has seen both agents
        leader.process.send_signal(signal.SIGKILL)
        await leader.process.wait()
        await resuming.ended()
        await lost.close()
        killed_at = asyncio.get_running_loop().time()

        async def took_over() -> bool:
            return bool((await cluster(survivor))["leader"] == (await cluster(survivor))["self"])

        await eventually(took_over, within_s=10)
        assert asyncio.get_running_loop().time() - killed_at <= 10

        # The survivor's sweeper runs now: the agent that did not come back is marked down.
        async def lost_is_down() -> bool:
            node = await get(survivor.url, f"/v1/nodes/{lost.node}")
            return bool(node["status"]["health"] == "down")

        await eventually(lost_is_down, within_s=15)

        # The agent that reconnects with its revision gets nothing older, then what is new.
        await resuming.connect(survivor.grpc_target)
        await resuming.nothing()
        await patch(survivor.url, "/v1/routing-policies/llama-default", {"slo_ttft_ms": 650})
        newer = await resuming.next(within_s=5)
        assert newer.revision > resuming.revision
        await steady.nothing(0.5)  # eu-west has its own policy: not affected
        node = await get(survivor.url, f"/v1/nodes/{resuming.node}")
        assert node["status"]["health"] == "up"
    finally:
        for agent in (resuming, lost, steady):
            await agent.close()


async def test_without_etcd_a_replica_keeps_serving_and_says_why(
    database_url: str, tmp_path: Path
) -> None:
    async with running_etcd(tmp_path / "etcd") as (endpoint, etcd_process):
        server = await start_server(database_url, etcd_endpoints=endpoint, lease_ttl_s="2")
        try:
            await seed(server.url)
            agent = await connected(server, "us-west")
            etcd_process.kill()
            await etcd_process.wait()

            async with httpx.AsyncClient(base_url=server.url, headers=ADMIN) as http:
                response = await http.get("/v1/cluster")
            assert response.status_code == 503
            assert response.json()["code"] == "coordination_unavailable"

            # PostgreSQL holds the truth: writes and pushes go on without etcd.
            await patch(server.url, "/v1/routing-policies/llama-default", {"slo_ttft_ms": 900})
            assert (await agent.next(within_s=10)).revision > agent.revision
            await agent.close()
        finally:
            await stop_child(server.process)


async def connected_here(server: Server) -> float:
    async with httpx.AsyncClient(base_url=server.url, headers=ADMIN, timeout=30) as http:
        text = (await http.get("/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("meridian_agents_connected{")
    )


async def test_agents_given_every_replica_spread_over_them(replicas: list[Server]) -> None:
    """Each agent starts at the address its node picks: no one replica sends to them all."""
    both = "ipv4:" + ",".join(s.grpc_target for s in replicas)
    token = await bootstrap_token(replicas[0].url, "us-west")
    agents = [Agent(spread(both, f"spread-{i}"), "us-west") for i in range(16)]
    try:
        for i, agent in enumerate(agents):
            await agent.register(token, hostname=f"10.9.0.{i + 1}", node=f"spread-{i}")
            await agent.connect()
            await agent.apply(await agent.next())
        counts = [await connected_here(s) for s in replicas]
        assert sum(counts) == 16
        assert min(counts) >= 4, counts  # 16 node names: 8 start at each replica
    finally:
        for agent in agents:
            await agent.close()
