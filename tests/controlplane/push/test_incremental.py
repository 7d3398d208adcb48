"""A revision is read and compiled only where it changed, and gives what a whole read and
compile give, byte for byte; a node's delta gives what its whole snapshot gives."""

from __future__ import annotations

import random
from collections import Counter

from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.content import digest
from meridian_pb.fleet.v1.delta import apply

from controlplane.db.engine import Database
from controlplane.push.hub import SnapshotHub
from controlplane.push.parts import PartsCompiler, RegionParts, parts_of
from controlplane.services.fleet_state import FleetReader, read_fleet_state
from controlplane.services.rollouts import store
from controlplane.services.rollouts.compose import compose
from controlplane.snapshot import FleetState, compile_region
from tests.controlplane.push.writes import Writer
from tests.kits.controlplane import Api
from tests.kits.fleet_docs import example

WRITES = 200


def encoded(parts: RegionParts) -> tuple[bytes, dict[str, bytes]]:
    return (
        parts.shared.SerializeToString(deterministic=True),
        {n: p.SerializeToString(deterministic=True) for n, p in parts.plans.items()},
    )


def whole(message: bytes) -> pb.Snapshot:
    parsed = pb.ControlMessage.FromString(message)
    assert parsed.WhichOneof("body") == "snapshot"
    return parsed.snapshot


async def test_random_writes_compile_incrementally_as_a_whole_compile_does(
    api: Api, database_url: str
) -> None:
    assert (await api.client.post("/v1/apply", json=example())).status_code == 200
    db = Database.connect(database_url, pool_size=2)
    hub = SnapshotHub(db)  # refreshed by hand, after each write
    reader, compiler = FleetReader(), PartsCompiler()
    writer = Writer(api, random.Random(29))
    held: dict[str, pb.Snapshot] = {}  # by node: what a stream that took all it was sent holds
    landed: Counter[str] = Counter()
    deltas = labelled = 0
    try:
        await reader_state(db, reader)
        for _ in range(WRITES):
            kind, ok = await writer.one()
            landed[kind] += ok
            async with db.sessions() as session, session.begin():
                await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
                state = await reader.read(session)
                assert state == await read_fleet_state(session)
                holdings = await store.read_holdings(session)
                intents = await store.read_intents(
                    session, {*holdings.regions.values(), *holdings.nodes.values()}
                )
            fleets: dict[int | None, FleetState] = {None: state}
            fleets |= {revision: compose(state, intent) for revision, intent in intents.items()}
            for label, fleet in fleets.items():
                labelled += label is not None
                for region, parts in compiler.compile(fleet, label).items():
                    expected = parts_of(compile_region(fleet, region))
                    assert encoded(parts) == encoded(expected), (kind, region, label)

            await hub.refresh()
            for region in state.regions:
                nodes = [n for n, spec in state.nodes.items() if spec.region == region]
                for node in nodes:
                    feed = hub.feed(region, node)
                    assert feed is not None
                    full = whole(feed.full(node))
                    assert full.digest == digest(full)
                    assert [p.name for p in full.nodes] == ([node] if node in feed.plans else [])
                    before = held.get(node)
                    if before is not None and before.revision != full.revision:
                        message = feed.delta(node, (before.revision, before.digest))
                        if message is not None:
                            delta = pb.ControlMessage.FromString(message).delta
                            made = apply(before, delta)
                            assert made is not None
                            made.ClearField("peer_load")
                            full.ClearField("peer_load")
                            assert made.SerializeToString(
                                deterministic=True
                            ) == full.SerializeToString(deterministic=True)
                            deltas += 1
                    held[node] = full
    finally:
        await db.close()
    assert all(landed[kind] >= 3 for kind in ("tenants", "nodes", "deployments", "regions")), landed
    assert reader.full_reads == 1  # the first: every later revision was read incrementally
    assert deltas > 100
    assert labelled > 0  # rollouts held regions at older intents: those compiled too


async def reader_state(db: Database, reader: FleetReader) -> FleetState:
    async with db.sessions() as session, session.begin():
        return await reader.read(session)


async def test_a_tenants_change_compiles_the_tenants_alone(api: Api, database_url: str) -> None:
    assert (await api.client.post("/v1/apply", json=example())).status_code == 200
    db = Database.connect(database_url, pool_size=1)
    reader, compiler = FleetReader(), PartsCompiler()
    try:
        compiler.compile(await reader_state(db, reader))
        first = compiler.sections_compiled
        response = await api.client.patch(
            "/v1/tenants/acme", json={"requests_per_minute": 60}, headers={"If-Match": "*"}
        )
        assert response.status_code == 200
        compiled = compiler.compile(await reader_state(db, reader))
    finally:
        await db.close()
    assert first == 6  # three regions, two sections each
    assert compiler.sections_compiled - first == 3  # each region's tenants, not its placement
    assert [t.requests_per_minute for t in compiled["us-east"].shared.tenants if t.name == "acme"]
