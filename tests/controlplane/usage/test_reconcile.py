"""Reconciliation counts each engine's work where it was done: a cascade's two answers each on
the engine that made it (its `calls`), a peer's carried part of a stream on the peer's engine,
and a hop and a refusal nowhere; records that ended outside an engine's metered intervals are
left out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from meridian_pb.fleet.v1 import fleet_pb2 as pb

from controlplane.db.engine import Database
from controlplane.services.usage.reconcile import reconcile
from controlplane.services.usage.store import UsageStore

T0 = datetime(2026, 11, 20, 12, tzinfo=UTC)


def _us(seconds: float) -> int:
    return int((T0 + timedelta(seconds=seconds)).timestamp() * 1e6)


def _meter(worker: str, since: float, until: float, prompt: int, generation: int) -> pb.UsageRecord:
    return pb.UsageRecord(id=f"m-{worker}-{since}", request_id=f"meter:{worker}", kind="meter",
                          worker=worker, started_us=_us(since), ended_us=_us(until),
                          prompt_tokens=prompt, completion_tokens=generation,
                          outcome="meter")  # fmt: skip


def _record(n: int, kind: str, worker: str, prompt: int, completion: int, ended: float,
            calls: list[pb.UsageCall] | None = None) -> pb.UsageRecord:  # fmt: skip
    return pb.UsageRecord(id=f"r-{n}", request_id=f"r{n}", kind=kind, tenant="acme", model="m",
                          answered_model="m", worker=worker, prompt_tokens=prompt,
                          completion_tokens=completion, started_us=_us(ended - 1),
                          ended_us=_us(ended), outcome="ok", status=200,
                          calls=calls or [])  # fmt: skip


async def test_each_engine_is_checked_against_the_work_it_did(database_url: str) -> None:
    cascade = [
        pb.UsageCall(model="large", worker="large-0", prompt_tokens=100, completion_tokens=20),
        pb.UsageCall(model="small", worker="small-0", prompt_tokens=100, completion_tokens=10),
    ]
    records = [
        _meter("small-0", 0, 60, 300, 30),
        _meter("large-0", 0, 60, 200, 40),
        _meter("small-0", 60, 120, 0, 0),
        _record(1, "served", "large-0", 200, 30, 10, cascade),  # one record, naming large
        _record(2, "served", "small-0", 150, 15, 20),
        _record(3, "carried", "large-0", 100, 20, 30),  # a peer's stream carried on here
        _record(4, "hop", "", 0, 0, 30),
        _record(5, "refused", "", 0, 0, 40),
        _record(6, "served", "small-0", 50, 5, 130),  # after the last reading: not counted
    ]
    db = Database.connect(database_url, pool_size=2)
    try:
        assert await UsageStore(db).store(records, "eu-west", "eu-west-1") == len(records)
        found = await reconcile(db, T0 - timedelta(minutes=1), T0 + timedelta(minutes=5))
    finally:
        await db.close()
    by = {f["worker"]: f for f in found}
    assert set(by) == {"small-0", "large-0"}
    assert by["small-0"]["readings"] == 2
    assert by["small-0"]["ledger"] == {"requests": 2, "prompt_tokens": 250,
                                       "completion_tokens": 25}  # fmt: skip
    assert by["small-0"]["drift"] == {"prompt_tokens": round(-50 / 300, 6),
                                      "completion_tokens": round(-5 / 30, 6)}  # fmt: skip
    assert by["large-0"]["ledger"] == {"requests": 2, "prompt_tokens": 200,
                                       "completion_tokens": 40}  # fmt: skip
    assert by["large-0"]["drift"] == {"prompt_tokens": 0.0, "completion_tokens": 0.0}
