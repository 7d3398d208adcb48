"""Usage records are stored once however often an agent sends them, each in its month's
partition, under the region and node of the agent that sent them."""

from __future__ import annotations

from datetime import UTC, datetime

from meridian_pb.fleet.v1 import fleet_pb2 as pb

from controlplane.db.engine import Database
from controlplane.services.usage.store import UsageStore
from tests.kits.services import sql


def _us(year: int, month: int, day: int) -> int:
    return int(datetime(year, month, day, 12, tzinfo=UTC).timestamp() * 1e6)


async def test_a_batch_sent_again_is_stored_once_in_its_months_partitions(
    database_url: str,
) -> None:
    records = [
        pb.UsageRecord(id=f"j1-{n}", seq=n, request_id=f"r{n}", kind="served", tenant="acme",
                       model="m", answered_model="m", region="elsewhere", node="another",
                       prompt_tokens=10 * n, completion_tokens=n, status=200, outcome="ok",
                       started_us=_us(2026, 10 + n % 2, 28), ended_us=_us(2026, 10 + n % 2, 28),
                       calls=[pb.UsageCall(model="m", worker="w1", prompt_tokens=10 * n)])
        for n in range(1, 7)
    ]  # fmt: skip
    db = Database.connect(database_url, pool_size=2)
    try:
        store = UsageStore(db)
        assert await store.store(records[:4], "eu-west", "eu-west-1") == 4
        # the acknowledgement was lost: the agent sends the batch again, and two more
        assert await UsageStore(db).store(records, "eu-west", "eu-west-1") == 2
    finally:
        await db.close()
    rows = await sql(database_url, "SELECT request_id, region, node, prompt_tokens, "
                     "tableoid::regclass::text, calls FROM usage_records ORDER BY id")  # fmt: skip
    assert [r[0] for r in rows] == [f"r{n}" for n in range(1, 7)]
    assert {(r[1], r[2]) for r in rows} == {("eu-west", "eu-west-1")}  # the sender's own
    assert [r[3] for r in rows] == [10, 20, 30, 40, 50, 60]
    assert {r[4] for r in rows} == {"usage_parts.usage_records_2026_10",
                                    "usage_parts.usage_records_2026_11"}  # fmt: skip
    assert rows[0][5] == [{"model": "m", "worker": "w1", "prompt_tokens": 10, "cached_tokens": 0,
                           "completion_tokens": 0}]  # fmt: skip
