"""An agent holding the region's previous revision is sent what changed; one further behind,
or whose delta does not give the digest it announced, is sent the whole snapshot."""

from __future__ import annotations

import httpx
from meridian_pb.fleet.v1 import fleet_pb2 as pb
from prometheus_client.parser import text_string_to_metric_families

from tests.kits.controlplane import Server
from tests.kits.push import ADMIN, Agent, patch, registered


async def counted(server: Server) -> dict[str, float]:
    """The control plane's counts of snapshots sent whole and as deltas, and of resyncs."""
    async with httpx.AsyncClient(base_url=server.url, headers=ADMIN, timeout=30) as http:
        text = (await http.get("/metrics")).text
    out: dict[str, float] = {"full": 0.0, "delta": 0.0, "resync": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "meridian_snapshots_sent_total":
                out[sample.labels["kind"]] += sample.value
            elif sample.name == "meridian_snapshot_resyncs_total":
                out["resync"] += sample.value
    return out


def content(snapshot: pb.Snapshot) -> bytes:
    copy = pb.Snapshot()
    copy.CopyFrom(snapshot)
    copy.ClearField("peer_load")  # advisory: as of each message's sending
    return copy.SerializeToString(deterministic=True)


async def fresh_copy(server: Server, agent: Agent) -> pb.Snapshot:
    """What a stream that holds nothing is sent for the same node: the whole snapshot."""
    other = Agent(server.grpc_target, agent.region, credential=agent.credential, node=agent.node)
    try:
        await other.connect()
        return await other.next()
    finally:
        await other.close()


async def test_the_previous_revision_gets_a_delta_and_an_older_one_the_whole(cp: Server) -> None:
    agent = await registered(cp, "us-east")
    try:
        await agent.connect()
        await agent.apply(await agent.next())
        before = await counted(cp)

        await patch(cp.url, "/v1/tenants/acme", {"requests_per_minute": 1234})
        changed = await agent.next()
        after = await counted(cp)
        assert (after["delta"] - before["delta"], after["full"] - before["full"]) == (1, 0)
        assert [t.requests_per_minute for t in changed.tenants if t.name == "acme"] != [0]
        await agent.apply(changed)
        assert content(changed) == content(await fresh_copy(cp, agent))

        # Away for two revisions: what it holds is not the base of the newest delta.
        await agent.disconnect()
        await patch(cp.url, "/v1/tenants/acme", {"requests_per_minute": 2345})
        await patch(cp.url, "/v1/deployments/qwen-us-east", {"engine_args": {"x": 1}})
        before = await counted(cp)
        await agent.connect()
        newest = await agent.next()
        after = await counted(cp)
        assert (after["delta"] - before["delta"], after["full"] - before["full"]) == (0, 1)
        assert content(newest) == content(await fresh_copy(cp, agent))
    finally:
        await agent.close()


async def test_a_delta_that_misses_its_digest_is_repaired_with_the_whole(cp: Server) -> None:
    agent = await registered(cp, "eu-west")
    try:
        await agent.connect()
        good = await agent.next()
        await agent.apply(good)
        # What the agent holds went wrong under its label (a bit flipped in memory, a bug):
        forged = pb.Snapshot()
        forged.CopyFrom(good)
        forged.tenants[0].tier = "forged"
        agent.held = forged
        await agent.connect()  # says the good revision and digest: nothing is sent
        await agent.nothing(for_s=0.5)

        before = await counted(cp)
        await patch(cp.url, "/v1/tenants/eurobank", {"tokens_per_minute": 400_000})
        repaired = await agent.next()
        after = await counted(cp)
        assert agent.stream.resyncs == 1
        assert after["resync"] - before["resync"] == 1
        assert (after["delta"] - before["delta"], after["full"] - before["full"]) == (1, 1)
        assert "forged" not in {t.tier for t in repaired.tenants}
        await agent.apply(repaired)
        assert content(repaired) == content(await fresh_copy(cp, agent))
    finally:
        await agent.close()
