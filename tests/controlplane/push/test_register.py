"""Only a valid bootstrap token of the region registers an agent, and only for that region."""

from __future__ import annotations

import grpc
import httpx
import pytest

from agents.control.fleet import FleetClient, error_code
from tests.kits.controlplane import Server
from tests.kits.push import ADMIN, Agent, bootstrap_token, get, registered
from tests.kits.services import sql


async def refused(client: FleetClient, token: str, **given: str) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.register(token, **{"hostname": "127.0.0.1", **given})  # type: ignore[arg-type]
    return caught.value.code(), error_code(caught.value) or ""


async def test_bad_expired_and_foreign_tokens_are_refused_and_change_nothing(
    cp: Server, database_url: str
) -> None:
    client = FleetClient(cp.grpc_target)
    try:
        east_token = await bootstrap_token(cp.url, "us-east")
        before = await get(cp.url, "/v1/revision")
        nodes_before = await get(cp.url, "/v1/nodes")

        assert await refused(client, "mb-00000000.not-a-token", region="us-east") == (
            grpc.StatusCode.UNAUTHENTICATED,
            "bootstrap_token_invalid",
        )
        assert await refused(client, east_token, region="eu-west") == (
            grpc.StatusCode.PERMISSION_DENIED,
            "wrong_region",
        )
        # A node of another region cannot be claimed with this region's token.
        assert await refused(client, east_token, region="us-east", node="eu-west-1") == (
            grpc.StatusCode.PERMISSION_DENIED,
            "wrong_region",
        )
        assert await refused(client, east_token, region="us-east", hostname="-bad-") == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "validation_failed",
        )

        await sql(database_url, "UPDATE bootstrap_tokens SET expires_at = now() - interval '1 s'")
        assert await refused(client, east_token, region="us-east") == (
            grpc.StatusCode.UNAUTHENTICATED,
            "bootstrap_token_expired",
        )

        assert await get(cp.url, "/v1/revision") == before
        assert await get(cp.url, "/v1/nodes") == nodes_before
    finally:
        await client.close()


async def test_a_revoked_bootstrap_token_is_refused_and_stays_revoked(cp: Server) -> None:
    client = FleetClient(cp.grpc_target)
    try:
        async with httpx.AsyncClient(base_url=cp.url, headers=ADMIN) as http:
            made = (await http.post("/v1/bootstrap-tokens", json={"region": "us-east"})).json()
            path, match = f"/v1/bootstrap-tokens/{made['name']}", {"If-Match": '"1"'}
            revoked = await http.patch(path, json={"revoked": True}, headers=match)
            assert revoked.status_code == 200, revoked.text
            assert revoked.json()["revoked"] is True
            assert await refused(client, made["token"], region="us-east") == (
                grpc.StatusCode.UNAUTHENTICATED,
                "bootstrap_token_revoked",
            )
            restored = await http.patch(path, json={"revoked": False}, headers={"If-Match": "*"})
            assert restored.status_code == 422, restored.text
            assert (await http.get(path)).json()["revoked"] is True
            audit = (await http.get("/v1/audit-events", params={"kind": "bootstrap-token"})).json()
            assert [e["action"] for e in audit["items"] if e["name"] == made["name"]] == [
                "update",
                "create",
            ]  # newest first
    finally:
        await client.close()


async def test_a_stream_needs_a_valid_credential_and_its_own_region(cp: Server) -> None:
    stranger = Agent(cp.grpc_target, "us-east", credential="ma-00000000.forged")
    agent = await registered(cp, "us-east")
    try:
        await stranger.connect()
        error = await stranger.ended()
        assert isinstance(error, grpc.aio.AioRpcError)
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        assert error_code(error) == "agent_credential_invalid"

        await agent.connect(region="eu-west")  # a us-east agent asks for eu-west
        error = await agent.ended()
        assert isinstance(error, grpc.aio.AioRpcError)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert error_code(error) == "wrong_region"

        await agent.connect()
        assert (await agent.next()).region.name == "us-east"
    finally:
        await stranger.close()
        await agent.close()


async def test_registering_again_replaces_the_credential(cp: Server) -> None:
    token = await bootstrap_token(cp.url, "us-west")
    first = Agent(cp.grpc_target, "us-west")
    await first.register(token)
    old_credential = first.credential
    await first.register(token, node=first.node)
    try:
        assert first.node == "us-west-1"
        assert first.credential != old_credential
        old = Agent(cp.grpc_target, "us-west", credential=old_credential, node=first.node)
        await old.connect()
        error = await old.ended()
        assert isinstance(error, grpc.aio.AioRpcError)
        assert error_code(error) == "agent_credential_invalid"
        await old.close()

        # An agent on a host the fleet does not declare gets a node of its own.
        other = Agent(cp.grpc_target, "us-west")
        await other.register(token, hostname="gpu-17.example")
        assert other.node == "us-west-gpu-17-example"
        node = await get(cp.url, f"/v1/nodes/{other.node}")
        assert node["region"] == "us-west"
        assert node["hostname"] == "gpu-17.example"
        await other.close()
    finally:
        await first.close()


async def test_a_stream_must_begin_with_hello(cp: Server) -> None:
    agent = await registered(cp, "eu-west")
    stream = agent.client.sync(agent.credential)
    try:
        await stream.ack(1)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stream.next_snapshot()
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_code(refused.value) == "protocol_violation"
    finally:
        stream.close()
        await agent.close()


async def test_a_pools_token_puts_the_machine_it_registers_in_its_pool(cp: Server) -> None:
    """A machine a pool's group starts (its cloud names it, the fleet does not) registers with
    its pool's token, and its node joins that pool, so the planner counts and sizes it."""
    async with httpx.AsyncClient(base_url=cp.url, headers=ADMIN) as http:
        refused = await http.post("/v1/bootstrap-tokens",
                                  json={"region": "eu-west", "pool": "us-east-h100"})  # fmt: skip
        assert refused.status_code == 422, refused.text
        assert "node pool 'us-east-h100' is in region 'us-east', not 'eu-west'" in refused.text
        made = await http.post("/v1/bootstrap-tokens",
                               json={"region": "us-east", "pool": "us-east-h100"})  # fmt: skip
        assert made.status_code == 201, made.text
        assert made.json()["pool"] == "us-east-h100"
        client = FleetClient(cp.grpc_target)
        try:
            done = await client.register(made.json()["token"], region="us-east",
                                         hostname="ip-10-0-3-7.ec2.internal")  # fmt: skip
        finally:
            await client.close()
        node = (await http.get(f"/v1/nodes/{done.node}")).json()
    assert (node["pool"], node["hostname"]) == ("us-east-h100", "ip-10-0-3-7.ec2.internal")
