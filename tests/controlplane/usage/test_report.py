"""GET /v1/usage sums the ledger by bucket of time, in the time zone asked for, and by group,
as OpenAI's usage API shapes it; GET /v1/usage/records exports the raw records; bad input
is refused with a problem's code."""

from __future__ import annotations

import csv
import io
import random
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import orjson
from meridian_pb.fleet.v1 import fleet_pb2 as pb
from sqlalchemy import text

from controlplane.services.usage.store import UsageStore
from tests.kits.controlplane import Api

PARIS = ZoneInfo("Europe/Paris")


def _at(year: int, month: int, day: int, hour: int, minute: int) -> int:
    """Paris wall-clock time as Unix microseconds."""
    return int(datetime(year, month, day, hour, minute, tzinfo=PARIS).timestamp() * 1e6)


def _record(n: int, at: int, tenant: str, model: str, kind: str = "served") -> pb.UsageRecord:
    served = kind == "served"
    return pb.UsageRecord(
        id=f"j-{n}", seq=n, request_id=f"r{n}", kind=kind, tenant=tenant, model=model,
        answered_model=model, service_class="standard", started_us=at, ended_us=at + 1000,
        prompt_tokens=100 if served else 0, cached_tokens=40 if served else 0,
        completion_tokens=10 if served else 0, cost_nanos=1_000_000 if served else 0,
        outcome="ok" if served else "quota_requests", status=200 if served else 429,
    )  # fmt: skip


async def _ledger(api: Api) -> None:
    records = [
        # the last hour of October and the first of November, in Paris (UTC+1): in UTC both
        # are in October
        _record(1, _at(2026, 10, 31, 23, 30), "acme", "llama"),
        _record(2, _at(2026, 11, 1, 0, 30), "acme", "llama"),
        _record(3, _at(2026, 11, 1, 0, 40), "acme", "qwen"),
        _record(4, _at(2026, 11, 1, 0, 50), "globex", "llama"),
        _record(5, _at(2026, 11, 1, 0, 55), "acme", "llama", "refused"),
        _record(6, _at(2026, 11, 1, 0, 56), "acme", "llama", "hop"),
    ]
    assert await UsageStore(api.db).store(records, "eu-west", "eu-west-1") == 6


async def _usage(api: Api, **params: Any) -> dict[str, Any]:
    answer = await api.client.get("/v1/usage", params=params)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def test_a_month_begins_at_midnight_where_the_operator_says(api: Api) -> None:
    await _ledger(api)
    start = int(datetime(2026, 10, 1, tzinfo=PARIS).timestamp())
    end = int(datetime(2026, 12, 1, tzinfo=PARIS).timestamp())
    paris = await _usage(api, start_time=start, end_time=end, bucket_width="1mo",
                         time_zone="Europe/Paris", group_by="tenant")  # fmt: skip
    assert paris["object"] == "page"
    assert paris["has_more"] is False
    october, november = paris["data"]
    assert october["start_time"] == start
    assert [(r["tenant"], r["num_model_requests"]) for r in october["results"]] == [("acme", 1)]
    acme, globex = november["results"]
    assert (acme["tenant"], acme["num_model_requests"], acme["num_refused_requests"]) == (
        "acme", 2, 1)  # fmt: skip
    assert (acme["input_tokens"], acme["input_cached_tokens"], acme["output_tokens"]) == (
        200, 80, 20)  # fmt: skip
    assert acme["cost"] == {"value": 0.002, "nanos": 2_000_000, "currency": "USD"}
    assert globex["num_model_requests"] == 1
    utc = await _usage(api, start_time=start, end_time=end, bucket_width="1mo")
    # in UTC, the window began on the 30th of September at 22:00, and all four are in October
    september, october, november = utc["data"]
    assert september["results"] == []
    assert november["results"] == []
    assert october["results"][0]["num_model_requests"] == 4


async def test_days_page_by_page_grouped_by_model_and_filtered_by_tenant(api: Api) -> None:
    await _ledger(api)
    start = int(datetime(2026, 10, 31, tzinfo=PARIS).timestamp())
    first = await _usage(api, start_time=start, end_time=start + 3 * 86400, limit=1,
                         time_zone="Europe/Paris", group_by="model", tenants="acme")  # fmt: skip
    assert first["has_more"] is True
    assert len(first["data"]) == 1
    second = await _usage(api, start_time=start, end_time=start + 3 * 86400, limit=1,
                          time_zone="Europe/Paris", group_by="model", tenants="acme",
                          page=first["next_page"])  # fmt: skip
    day = second["data"][0]
    assert day["start_time"] == int(datetime(2026, 11, 1, tzinfo=PARIS).timestamp())
    assert [(r["model"], r["num_model_requests"]) for r in day["results"]] == [
        ("llama", 1), ("qwen", 1)]  # fmt: skip


async def test_the_raw_records_of_a_period_as_json_lines_and_csv(api: Api) -> None:
    await _ledger(api)
    start = int(datetime(2026, 11, 1, tzinfo=PARIS).timestamp())
    params: dict[str, str | int] = {"start_time": start, "end_time": start + 86400,
                                    "tenants": "acme"}  # fmt: skip
    lines = await api.client.get("/v1/usage/records", params=params)
    assert lines.status_code == 200, lines.text
    docs = [orjson.loads(line) for line in lines.content.splitlines()]
    assert [d["request_id"] for d in docs] == ["r2", "r3", "r5", "r6"]
    assert docs[0]["cost_nanos"] == 1_000_000
    assert docs[0]["region"] == "eu-west"
    table = await api.client.get("/v1/usage/records", params=params | {"format": "csv"})
    rows = list(csv.DictReader(io.StringIO(table.text)))
    assert [r["request_id"] for r in rows] == ["r2", "r3", "r5", "r6"]
    assert rows[2]["kind"] == "refused"
    assert rows[2]["prompt_tokens"] == "0"


async def test_a_report_asked_wrong_is_refused_with_its_field(api: Api) -> None:
    cases: list[dict[str, str | int]] = [
        {},  # no start
        {"start_time": 100, "end_time": 50},
        {"start_time": 100, "time_zone": "Mars/Olympus"},
        {"start_time": 100, "group_by": "tenant,colour"},
        {"start_time": 100, "bucket_width": "1w"},
        {"start_time": -1},
    ]
    for bad in cases:
        answer = await api.client.get("/v1/usage", params=bad)
        assert answer.status_code == 422, (bad, answer.text)
        assert answer.json()["code"] == "validation_failed", bad
    viewer = await api.client.get("/v1/usage", params={"start_time": 0},
                                  headers={"Authorization": "Bearer nobody"})  # fmt: skip
    assert viewer.status_code == 401


async def test_zones_of_half_and_quarter_hours_split_their_days_where_they_begin(
    api: Api,
) -> None:
    """The sums are by quarter hour: a zone half an hour (Asia/Kolkata) or three quarters
    (Asia/Kathmandu) off UTC splits its days on them as the records themselves would."""
    records = []
    for n, name in enumerate(("Asia/Kolkata", "Asia/Kathmandu")):
        zone = ZoneInfo(name)
        for m, (day, hour, minute) in enumerate(((1, 23, 50), (2, 0, 5))):
            at = datetime(2026, 11, day, hour, minute, tzinfo=zone)
            records.append(_record(10 * n + m, int(at.timestamp() * 1e6), name, "llama"))
    assert await UsageStore(api.db).store(records, "ap-south", "ap-south-1") == 4
    async with api.db.sessions() as session:
        quarters = (await session.execute(text("SELECT count(*) FROM usage_quarters"))).scalar()
    assert quarters == 4  # each record its own quarter hour
    for name in ("Asia/Kolkata", "Asia/Kathmandu"):
        start = int(datetime(2026, 11, 1, tzinfo=ZoneInfo(name)).timestamp())
        for begin in (start, start + 1):  # from the sums; from the records (mid-quarter)
            days = await _usage(api, start_time=begin, end_time=start + 2 * 86400,
                                time_zone=name, tenants=name)  # fmt: skip
            counts = [sum(r["num_model_requests"] for r in d["results"]) for d in days["data"]]
            assert counts == [1, 1], (name, begin, counts)
        utc = await _usage(api, start_time=start, end_time=start + 2 * 86400, tenants=name)
        assert sum(r["num_model_requests"] for d in utc["data"] for r in d["results"]) == 2


async def test_a_period_of_millennia_answers_a_page_at_once(api: Api) -> None:
    last = 253_402_214_400  # 9999-12-31
    hours = await _usage(api, start_time=0, end_time=last, bucket_width="1h",
                         time_zone="Pacific/Kiritimati")  # fmt: skip
    assert len(hours["data"]) == 744
    assert hours["has_more"] is True
    months = await _usage(api, start_time=last - 86400 * 400, end_time=last, bucket_width="1mo")
    assert months["data"][-1]["start_time"] < last
    too_late = await api.client.get("/v1/usage", params={"start_time": last + 1})
    assert too_late.status_code == 422


async def test_any_period_in_any_zone_is_summed_as_the_records_say(api: Api) -> None:
    """A period that begins and ends at any second is read from the sums for its whole
    quarter hours and from the records at its ends: the same counts, bucket by bucket, as
    the records themselves give, over random periods, widths and zones."""
    rng = random.Random(20261128)
    base = int(datetime(2026, 11, 2, tzinfo=ZoneInfo("UTC")).timestamp())
    starts = sorted(base + rng.randrange(0, 3 * 86400) for _ in range(300))
    records = [_record(n, at * 1_000_000, rng.choice(("acme", "globex")), "llama")
               for n, at in enumerate(starts)]  # fmt: skip
    assert await UsageStore(api.db).store(records, "eu-west", "eu-west-1") == len(records)
    zones = ("UTC", "Asia/Kolkata", "Asia/Kathmandu", "America/St_Johns", "Europe/Paris")
    for _ in range(25):
        zone, width = rng.choice(zones), rng.choice(("1h", "1d"))
        begin = base + rng.randrange(-3600, 86400)
        end = begin + rng.randrange(60, 2 * 86400)
        page = await _usage(api, start_time=begin, end_time=end, bucket_width=width,
                            time_zone=zone, group_by="tenant", limit=744)  # fmt: skip
        for bucket in page["data"]:
            low, high = max(bucket["start_time"], begin), min(bucket["end_time"], end)
            for tenant in ("acme", "globex"):
                expected = sum(1 for r, at in zip(records, starts, strict=True)
                               if r.tenant == tenant and low <= at < high)  # fmt: skip
                got = sum(r["num_model_requests"] for r in bucket["results"]
                          if r["tenant"] == tenant)  # fmt: skip
                assert got == expected, (zone, width, begin, end, bucket["start_time"], tenant)
