"""Snapshots reach the agents of the regions a change affects, and only those."""

from __future__ import annotations

from typing import Any

import grpc
from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents.control.fleet import error_code
from tests.kits.controlplane import Server
from tests.kits.push import eventually, get, patch, registered


async def node_status(server: Server, node: str) -> dict[str, Any]:
    doc: dict[str, Any] = await get(server.url, f"/v1/nodes/{node}")
    return doc


async def test_a_new_agent_gets_its_own_regions_snapshot_and_its_ack_is_recorded(
    cp: Server,
) -> None:
    agent = await registered(cp, "us-east")
    try:
        assert agent.node == "us-east-1"  # the declared node with the agent's hostname
        await agent.connect()
        snapshot = await agent.next()
        assert snapshot.region.name == "us-east"
        assert [n.name for n in snapshot.nodes] == ["us-east-1"]
        assert {w.model for w in snapshot.workers} == {
            "llama-3.1-8b-instruct",
            "qwen2.5-32b-instruct",
        }
        # The fleet was applied at revision 1. Creating the bootstrap token made revision 2,
        # which changed no snapshot, so the snapshot keeps its revision.
        assert snapshot.revision == 1
        assert (await get(cp.url, "/v1/revision"))["revision"] == 2
        await agent.apply(snapshot)

        async def acked() -> bool:
            node = await node_status(cp, "us-east-1")
            return bool(
                node["status"]["applied_revision"] == snapshot.revision
                and node["status"]["health"] == "up"
            )

        await eventually(acked)
        node = await node_status(cp, "us-east-1")
        assert node["status"]["desired_revision"] == snapshot.revision
        await agent.nothing()
    finally:
        await agent.close()


async def test_a_change_reaches_the_affected_region_only(cp: Server) -> None:
    east, eu = await registered(cp, "us-east"), await registered(cp, "eu-west")
    try:
        for agent in (east, eu):
            await agent.connect()
            await agent.apply(await agent.next())

        await patch(cp.url, "/v1/deployments/llama-eu-west", {"replicas": 1})
        changed = await eu.next()
        assert changed.revision > eu.revision
        assert sum(len(n.engines) for n in changed.nodes) == 1
        await eu.apply(changed)
        await east.nothing()

        # A tenant is allowed everywhere it may go: both regions hear of its new quota.
        await patch(cp.url, "/v1/tenants/acme", {"requests_per_minute": 1234})
        for agent in (east, eu):
            snapshot = await agent.next()
            acme = next(t for t in snapshot.tenants if t.name == "acme")
            assert acme.requests_per_minute > 0
            await agent.apply(snapshot)
    finally:
        await east.close()
        await eu.close()


async def test_an_agent_that_reconnects_with_its_revision_gets_only_what_is_newer(
    cp: Server,
) -> None:
    agent = await registered(cp, "us-west")
    try:
        await agent.connect()
        first = await agent.next()
        await agent.apply(first)
        await agent.disconnect()

        await agent.connect()  # says revision and digest of `first`
        await agent.nothing()

        await patch(cp.url, "/v1/routing-policies/llama-default", {"slo_ttft_ms": 777})
        await agent.disconnect()  # the change lands while the agent is away
        await agent.connect()
        newer = await agent.next()
        assert newer.revision > first.revision
        assert newer.digest != first.digest
    finally:
        await agent.close()


async def test_a_nack_keeps_the_previous_revision_and_shows_the_reason(cp: Server) -> None:
    agent = await registered(cp, "eu-west")
    try:
        await agent.connect()
        good = await agent.next()
        await agent.apply(good)
        await patch(cp.url, "/v1/deployments/llama-eu-west", {"engine_args": {"mem-frac": 0.5}})
        bad = await agent.next()
        await agent.refuse(bad, "engine_args: unknown argument mem-frac")

        async def nacked() -> dict[str, Any] | None:
            node = await node_status(cp, agent.node)
            return node if node["status"]["last_nack_reason"] else None

        node = await eventually(nacked)
        assert node["status"]["applied_revision"] == good.revision
        assert node["status"]["desired_revision"] == bad.revision
        assert "unknown argument mem-frac" in node["status"]["last_nack_reason"]
        await agent.nothing()  # the refused snapshot is not sent again and again
    finally:
        await agent.close()


async def test_heartbeats_are_stored_and_silence_ends_the_stream(cp: Server) -> None:
    agent = await registered(cp, "us-east")
    try:
        await agent.connect()
        await agent.apply(await agent.next())
        await agent.silence()
        telemetry = pb.Telemetry(inflight_requests=7, queued_requests=2, prefix_cache_hit_rate=0.5)
        telemetry.observed_at.GetCurrentTime()
        await agent.heartbeat(telemetry)

        async def beat_seen() -> bool:
            return (await node_status(cp, agent.node))["status"]["last_heartbeat_at"] is not None

        await eventually(beat_seen)
        # The agent now falls silent: the control plane closes the stream after 2 s...
        error = await agent.ended(within_s=10)
        assert isinstance(error, grpc.aio.AioRpcError)
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert error_code(error) == "heartbeat_missed"

        # ... and the liveness sweeper marks the node down once nobody holds it, and then
        # its region, whose only node it is.
        async def down() -> bool:
            return bool((await node_status(cp, agent.node))["status"]["health"] == "down")

        await eventually(down)

        async def region_down() -> bool:
            return bool((await get(cp.url, "/v1/regions/us-east"))["status"]["health"] == "down")

        await eventually(region_down, within_s=15)
    finally:
        await agent.close()


async def test_a_regions_load_reaches_its_peers_in_their_next_snapshot(cp: Server) -> None:
    east, eu = await registered(cp, "us-east"), await registered(cp, "eu-west")
    try:
        east.telemetry = pb.Telemetry(inflight_requests=7, queued_requests=3)
        east.telemetry.engines.add(id="e1", state="ready")
        for agent in (east, eu):
            await agent.connect()
            await agent.apply(await agent.next())

        async def rolled_up() -> dict[str, Any] | None:
            region = await get(cp.url, "/v1/regions/us-east")
            load = region["status"]["load"]
            return region if load and load["inflight_requests"] == 7 else None

        region = await eventually(rolled_up, within_s=20)
        assert region["status"]["health"] == "up"
        assert region["status"]["load"]["engines_ready"] == 1

        await patch(cp.url, "/v1/deployments/llama-eu-west", {"replicas": 1})
        snapshot = await eu.next()
        peers = {p.region: p for p in snapshot.peer_load}
        assert "eu-west" not in peers  # a region is not its own peer
        assert peers["us-east"].inflight_requests == 7
        assert peers["us-east"].queued_requests == 3
        assert peers["us-east"].health == "up"
    finally:
        await east.close()
        await eu.close()
