"""OpenAI's Files and Batches API on the control plane, for a tenant's key, driven by the
unchanged `openai` client: a file uploaded and read back, a batch made of it, listed,
retrieved and cancelled; bad input refused with the line that is wrong, changing nothing; a
tenant sees nothing of another's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from sqlalchemy import func, select

from controlplane.db.batch_rows import BatchLineRow, BatchRow, FileRow
from controlplane.db.engine import Database
from meridian.procs import stop_child
from tests.kits.controlplane import ADMIN_TOKEN, run_cli, start_server
from tests.kits.fleet_docs import BASE

CHAT = "/v1/chat/completions"


def jsonl(*lines: dict[str, Any]) -> bytes:
    return b"\n".join(orjson.dumps(line) for line in lines) + b"\n"


def request(n: int, url: str = CHAT, **body: Any) -> dict[str, Any]:
    return {"custom_id": f"q{n}", "method": "POST", "url": url,
            "body": {"model": "llama-8b", "messages": [{"role": "user", "content": f"{n}"}],
                     **body}}  # fmt: skip


@dataclass
class Api:
    """The control plane, a real child process keeping files in the test's directory; an
    admin's client of it, and its database."""

    client: httpx.AsyncClient
    db: Database
    url: str


@pytest.fixture
async def api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    server = await start_server(database_url, data_dir=str(tmp_path))
    db = Database.connect(database_url, pool_size=2)
    try:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as http:
            yield Api(http, db, server.url)
    finally:
        await db.close()
        await stop_child(server.process)


@pytest.fixture
async def keys(api: Api) -> dict[str, str]:
    assert (await api.client.post("/v1/apply", json=BASE)).status_code == 200
    assert (await api.client.post("/v1/tenants", json={"name": "initech"})).status_code == 201
    made = {}
    for tenant in ("acme", "initech"):
        answer = await api.client.post("/v1/api-keys", json={"tenant": tenant})
        made[tenant] = answer.json()["key"]
    return made


@pytest.fixture
async def client(api: Api, keys: dict[str, str]) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(api_key=keys["acme"], base_url=f"{api.url}/v1",
                                  max_retries=0) as made:  # fmt: skip
        yield made


async def test_the_openai_client_uploads_makes_reads_and_cancels_a_batch(
    api: Api, client: openai.AsyncOpenAI
) -> None:
    data = jsonl(*(request(n) for n in range(5)))
    uploaded = await client.files.create(file=("in.jsonl", data), purpose="batch")
    assert (uploaded.filename, uploaded.bytes, uploaded.purpose) == ("in.jsonl", len(data), "batch")
    assert (await client.files.content(uploaded.id)).content == data  # byte for byte
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h",
        metadata={"job": "nightly"},
    )  # fmt: skip
    assert batch.status == "in_progress"
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed) == (5, 0)
    assert batch.metadata == {"job": "nightly"}
    assert batch.expires_at is not None
    assert batch.expires_at - batch.created_at == 24 * 3600
    again = await client.batches.retrieve(batch.id)
    assert again.id == batch.id
    assert again.input_file_id == uploaded.id
    listed = await client.batches.list()
    assert [b.id for b in listed.data] == [batch.id]
    cancelled = await client.batches.cancel(batch.id)
    assert cancelled.status == "cancelled"  # nothing was under way: cancelled at once
    assert cancelled.cancelled_at is not None
    async with api.db.sessions() as session:
        states = (await session.execute(
            select(BatchLineRow.state, func.count()).group_by(BatchLineRow.state)
        )).all()  # fmt: skip
    assert dict(states) == {"dropped": 5}  # no line is sent after a cancel
    assert (await client.batches.cancel(batch.id)).status == "cancelled"  # again: the same
    async with api.db.sessions() as session, session.begin():
        row = await session.get(BatchRow, batch.id)
        assert row is not None
        row.status = "completed"
    with pytest.raises(openai.ConflictError):  # an ended batch is not cancelled
        await client.batches.cancel(batch.id)


async def test_a_file_that_is_not_a_batchs_input_is_refused_with_its_line(
    api: Api, client: openai.AsyncOpenAI
) -> None:
    bad = jsonl(request(1), request(1), request(2, url="/v1/embeddings"), request(3, stream=True))
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        await client.files.create(file=("bad.jsonl", bad + b"{not json\n"), purpose="batch")
    problem = refused.value.response.json()
    fields = {e["field"]: e["message"] for e in problem["errors"]}
    assert "used twice" in fields["file.line.2"]
    assert "url must be one of" in fields["file.line.3"]
    assert "not streamed" in fields["file.line.4"]
    assert "not JSON" in fields["file.line.5"]
    with pytest.raises(openai.UnprocessableEntityError):
        await client.files.create(file=("x.jsonl", jsonl(request(1))), purpose="fine-tune")
    good = await client.files.create(file=("ok.jsonl", jsonl(request(1))), purpose="batch")
    for wrong in (
        {"endpoint": "/v1/completions", "completion_window": "24h"},  # the lines ask chat
        {"endpoint": CHAT, "completion_window": "0h"},
        {"endpoint": CHAT, "completion_window": "24h", "metadata": {"k": 1}},
    ):
        with pytest.raises(openai.UnprocessableEntityError):
            await client.batches.create(input_file_id=good.id, **wrong)
    async with api.db.sessions() as session:
        assert await session.scalar(select(func.count()).select_from(BatchRow)) == 0
        assert await session.scalar(select(func.count()).select_from(FileRow)) == 1


async def test_a_tenant_sees_nothing_of_anothers(
    api: Api, client: openai.AsyncOpenAI, keys: dict[str, str]
) -> None:
    mine = await client.files.create(file=("in.jsonl", jsonl(request(1))), purpose="batch")
    acme = {"Authorization": f"Bearer {keys['acme']}"}
    made = await api.client.post("/v1/batches", headers=acme, json={
        "input_file_id": mine.id, "endpoint": CHAT, "completion_window": "1h"})  # fmt: skip
    assert made.status_code == 200, made.text
    batch = openai.types.Batch.model_validate(made.json())
    other = {"Authorization": f"Bearer {keys['initech']}"}
    for path in (f"/v1/files/{mine.id}", f"/v1/files/{mine.id}/content",
                 f"/v1/batches/{batch.id}", "/v1/files/file-nope"):  # fmt: skip
        answer = await api.client.get(path, headers=other)
        assert answer.status_code == 404, path
    assert (await api.client.get("/v1/batches", headers=other)).json()["data"] == []
    cancel = await api.client.post(f"/v1/batches/{batch.id}/cancel", headers=other)
    assert cancel.status_code == 404
    # an admin's token is not a tenant's key
    assert (await api.client.get("/v1/batches")).status_code == 401


async def test_meridian_batches_submits_lists_shows_and_cancels(
    api: Api, keys: dict[str, str], tmp_path: Path
) -> None:
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(jsonl(*(request(n) for n in range(3))))
    env = {"MERIDIAN_URL": api.url, "MERIDIAN_API_KEY": keys["acme"]}
    code, out = await run_cli("batches", "submit", str(requests), env=env)
    assert code == 0, out
    batch = out.split()[1].rstrip(":")
    assert batch.startswith("batch_")
    assert "3 requests, in_progress" in out
    code, out = await run_cli("batches", "list", env=env)
    assert code == 0, out
    assert batch in out
    code, out = await run_cli("batches", "cancel", batch, env=env)
    assert code == 0, out
    assert "cancelled" in out
    code, out = await run_cli("batches", "output", batch, "-o", str(tmp_path / "o"), env=env)
    assert code == 1, out
    assert "no output file" in out  # nothing ran: nothing to write
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"custom_id": "x"}\n')
    code, out = await run_cli("batches", "submit", str(bad), env=env)
    assert code == 1, out
    assert "file.line.1" in out  # the line that is wrong, named
    code, out = await run_cli("batches", "list", env={"MERIDIAN_URL": api.url})
    assert code == 2
    assert "MERIDIAN_API_KEY" in out
