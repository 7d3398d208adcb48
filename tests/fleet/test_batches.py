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

import openai
import orjson
import pytest
from sqlalchemy import func, select

from controlplane.db.batch_rows import BatchLineRow
from controlplane.db.engine import Database
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
    async with openai.AsyncOpenAI(api_key=fleet.keys[tenant], base_url=f"{base}/v1",
                                  max_retries=0) as client:  # fmt: skip
        uploaded = await client.files.create(file=("in.jsonl", _input(lines)), purpose="batch")
        batch = await client.batches.create(input_file_id=uploaded.id,
                                            endpoint="/v1/chat/completions",
                                            completion_window="24h")  # fmt: skip
        async with asyncio.timeout(within_s):
            while batch.status not in ("completed", "failed", "expired", "cancelled"):
                await asyncio.sleep(0.5)
                batch = await client.batches.retrieve(batch.id)
        assert batch.output_file_id is not None, batch
        output = (await client.files.content(batch.output_file_id)).content
    return batch, output


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


async def test_a_batch_runs_within_residency_and_answers_each_line_once(
    database_url: str, tmp_path: Path
) -> None:
    env = {"data_dir": str(tmp_path / "cp")}
    async with fleet_of(database_url, tmp_path, cp_env=env) as fleet:
        batch, output = await _run(fleet, "acme", 60)
        eu_batch, eu_output = await _run(fleet, "eurobank", 20, via="eu-west")  # an agent's port
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


async def test_a_region_killed_mid_batch_loses_no_line(database_url: str, tmp_path: Path) -> None:
    env = {"data_dir": str(tmp_path / "cp")}
    async with fleet_of(database_url, tmp_path, ("us-east", "us-west"), cp_env=env) as fleet:
        await fleet.speed_engines("us-west", 20)  # slow: lines are under way there
        running = asyncio.create_task(_run(fleet, "acme", 200, within_s=120))
        db = Database.connect(database_url, pool_size=1)
        try:
            async with asyncio.timeout(60):
                while True:
                    async with db.sessions() as session:
                        there = await session.scalar(
                            select(func.count()).where(BatchLineRow.region == "us-west",
                                                       BatchLineRow.state == "running")
                        )  # fmt: skip
                    if there:
                        break
                    await asyncio.sleep(0.1)
        finally:
            await db.close()
        os.kill(fleet.agents["us-west"].process.pid, signal.SIGKILL)
        batch, output = await running
    assert batch.status == "completed"
    assert _answered(output) == [f"q{n}" for n in range(200)]
