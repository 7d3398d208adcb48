"""Batches on a fleet of real processes: the unchanged `openai` client makes one on the control
plane, the leader's runner sends its lines to the regions the tenant's residency allows, as
the batch class, and the output file answers every line exactly once, in the input's order;
a region whose agent is killed mid-batch loses no line."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import orjson
import pytest
from meridian_pb.fleet.v1.assertion import CONTROL_PLANE
from sqlalchemy import func, select

from controlplane.db.batch_rows import BatchLineRow
from controlplane.db.engine import Database
from meridian.procs import ControlPlane, start_control_plane, stop_child
from tests.kits.controlplane import ADMIN_TOKEN, kek_file
from tests.kits.fleet import LLAMA, Fleet, fleet_of


def _input(lines: int) -> bytes:
    return b"".join(
        orjson.dumps({"custom_id": f"q{n}", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": LLAMA, "max_tokens": 4,
                               "messages": [{"role": "user", "content": f"question {n}"}]}})
        + b"\n"
        for n in range(lines)
    )  # fmt: skip


async def _run(
    fleet: Fleet, tenant: str, lines: int, within_s: float = 90, via: str | None = None
) -> tuple[Any, bytes]:
    """The batch, once ended, and its output file's bytes; made through the control plane,
    or through the port of the agent of region `via`."""
    base = fleet.agents[via].url if via is not None else fleet.cp.url
    made = await _create(base, fleet.keys[tenant], lines)
    return await _ended(base, fleet.keys[tenant], made, within_s)


async def _create(base: str, key: str, lines: int) -> str:
    async with openai.AsyncOpenAI(api_key=key, base_url=f"{base}/v1", max_retries=0) as client:
        uploaded = await client.files.create(file=("in.jsonl", _input(lines)), purpose="batch")
        batch = await client.batches.create(input_file_id=uploaded.id,
                                            endpoint="/v1/chat/completions",
                                            completion_window="24h")  # fmt: skip
    return batch.id


async def _ended(base: str, key: str, batch_id: str, within_s: float) -> tuple[Any, bytes]:
    """Polled until it ends, through a control plane that may be restarting."""
    async with (
        openai.AsyncOpenAI(api_key=key, base_url=f"{base}/v1", max_retries=0) as client,
        asyncio.timeout(within_s),
    ):
        while True:
            try:
                batch = await client.batches.retrieve(batch_id)
                if batch.status in ("completed", "failed", "expired", "cancelled"):
                    assert batch.output_file_id is not None, batch
                    return batch, (await client.files.content(batch.output_file_id)).content
            except openai.APIConnectionError:
                pass  # it is being restarted
            await asyncio.sleep(0.5)


def _answered(output: bytes) -> list[str]:
    custom_ids = []
    for line in output.splitlines():
        entry = orjson.loads(line)
        assert entry["error"] is None
        assert entry["response"]["status_code"] == 200
        assert entry["response"]["body"]["choices"][0]["message"]["content"] is not None
        custom_ids.append(entry["custom_id"])
    return custom_ids


async def _regions(database_url: str, batch: str) -> dict[str, int]:
    db = Database.connect(database_url, pool_size=1)
    try:
        async with db.sessions() as session:
            rows = await session.execute(
                select(BatchLineRow.region, func.count())
                .where(BatchLineRow.batch_id == batch)
                .group_by(BatchLineRow.region)
            )
            return {str(region): n for region, n in rows}
    finally:
        await db.close()


def _eurobank_rate(doc: dict[str, Any]) -> None:
    bank = next(t for t in doc["tenants"] if t["name"] == "eurobank")
    bank["requests_per_minute"] = 6


async def _direct(fleet: Fleet, tenant: str, region: str, n: int) -> list[int]:
    """`n` requests of the tenant's own, at once: their statuses."""
    async with openai.AsyncOpenAI(api_key=fleet.keys[tenant], max_retries=0,
                                  base_url=f"{fleet.agents[region].url}/v1") as client:  # fmt: skip

        async def one() -> int:
            try:
                await client.chat.completions.create(
                    model=LLAMA, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
                )
                return 200
            except openai.APIStatusError as error:
                return error.status_code

        return list(await asyncio.gather(*(one() for _ in range(n))))


async def test_a_batch_runs_within_residency_and_answers_each_line_once(
    database_url: str, tmp_path: Path
) -> None:
    """And outside its tenant's rate quota: eurobank may make 6 requests a minute of its own,
    and its 20 lines all run (OpenAI keeps batch limits apart from rate limits too)."""
    env = {"data_dir": str(tmp_path / "cp")}
    async with fleet_of(database_url, tmp_path, change=_eurobank_rate, cp_env=env) as fleet:
        batch, output = await _run(fleet, "acme", 60)
        eu_batch, eu_output = await _run(fleet, "eurobank", 20, via="eu-west")  # an agent's port
        assert 429 in await _direct(fleet, "eurobank", "eu-west", 12)  # its quota holds
        async with openai.AsyncOpenAI(
            api_key=fleet.keys["eurobank"],
            max_retries=0,
            base_url=f"{fleet.agents['us-east'].url}/v1",
        ) as client:
            with pytest.raises(openai.PermissionDeniedError):  # not served in us-east at all
                await client.batches.list()
    assert batch.status == "completed"
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (60, 0)
    assert _answered(output) == [f"q{n}" for n in range(60)]  # each once, in order
    assert batch.error_file_id is None
    assert _answered(eu_output) == [f"q{n}" for n in range(20)]
    assert set(await _regions(database_url, eu_batch.id)) == {"eu-west"}  # its residency
    assert len(await _regions(database_url, batch.id)) >= 2  # acme's: wherever had room


async def _count(db: Database, *where: Any) -> int:
    async with db.sessions() as session:
        return int(await session.scalar(select(func.count()).where(*where)) or 0)


async def _until(db: Database, *where: Any, at_least: int = 1, within_s: float = 60) -> None:
    async with asyncio.timeout(within_s):
        while await _count(db, *where) < at_least:  # noqa: ASYNC110 (other processes' rows)
            await asyncio.sleep(0.1)


def _us_only(doc: dict[str, Any]) -> None:
    acme = next(t for t in doc["tenants"] if t["name"] == "acme")
    acme["allowed_jurisdictions"] = ["us"]


@pytest.mark.alone  # a heavy load of its own: it would slow tests timed beside it
async def test_2000_lines_survive_a_region_and_the_control_plane_killed(
    database_url: str, tmp_path: Path
) -> None:
    """acme may be served in the us only. Its batch of 2,000 lines runs over us-east and
    us-west, never eu-west. us-west's agent is killed -9 while lines run there, and then the
    control plane, which comes back on the same ports: every line is answered exactly once,
    in order, and none ran in eu-west."""
    env = {"data_dir": str(tmp_path / "cp")}
    db = Database.connect(database_url, pool_size=1)
    restarted: ControlPlane | None = None
    try:
        async with fleet_of(database_url, tmp_path, change=_us_only, cp_env=env) as fleet:
            await fleet.speed_engines("us-west", 10)  # slower: lines are under way there
            batch_id = await _create(fleet.cp.url, fleet.keys["acme"], 2000)
            line = BatchLineRow
            await _until(db, line.region == "us-west", line.state == "running")
            os.kill(fleet.agents["us-west"].process.pid, signal.SIGKILL)
            await _until(db, line.state == "done", at_least=500)
            grpc_port = int(fleet.cp.grpc_target.rsplit(":", 1)[1])
            await fleet.kill_control_plane()
            restarted = await start_control_plane(
                {"MERIDIAN_DATABASE_URL": database_url, "MERIDIAN_ADMIN_TOKEN": ADMIN_TOKEN,
                 "MERIDIAN_LOG_LEVEL": "warning", "MERIDIAN_DATA_DIR": env["data_dir"],
                 "MERIDIAN_KMS_KEY_FILE": kek_file(database_url)},
                port=urlsplit(fleet.cp.url).port, grpc_port=grpc_port, timeout_s=60,
            )  # fmt: skip
            batch, output = await _ended(fleet.cp.url, fleet.keys["acme"], batch_id, 240)
            eu = await fleet.escalations("eu-west")
        regions = await _regions(database_url, batch_id)
    finally:
        await db.close()
        if restarted is not None:
            await stop_child(restarted.process)
    assert batch.status == "completed"
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2000, 0)
    assert _answered(output) == [f"q{n}" for n in range(2000)]  # each once, in order
    assert "eu-west" not in regions
    assert not eu.get(("in", CONTROL_PLANE))  # no line ever sent there
