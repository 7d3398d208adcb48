"""A batch's end: once none of its lines is pending or running, its output file (the answers
with status 200) and its error file (the other answers, the lines that failed, and those its
window left unrun) are written to the object store, in the order of the input, and the batch
is `completed`, `expired` or `cancelled`. The files are written outside any transaction; the
batch names them in the one that ends it, so a crash between leaves at most unnamed
objects, and the next leader finalizes it again."""

from __future__ import annotations

import secrets

import orjson
from sqlalchemy import select

from controlplane.db.base import utcnow
from controlplane.db.batch_rows import BatchLineRow, BatchRow
from controlplane.db.engine import Database
from controlplane.services.batches.files import TenantCaller, keep
from controlplane.services.batches.store import ObjectStore


async def finalize(db: Database, store: ObjectStore, batch_id: str) -> str | None:
    """The batch's files and its last status; None if it is not ready to end (or ended)."""
    async with db.sessions() as session, session.begin():
        batch = await session.get(BatchRow, batch_id, with_for_update=True)
        if batch is None or batch.status not in ("in_progress", "cancelling", "finalizing"):
            return None
        if batch.status != "finalizing":
            batch.status, batch.finalizing_at = "finalizing", utcnow()
        tenant = TenantCaller(batch.tenant_id, "")
    async with db.sessions() as session:
        lines = (await session.execute(
            select(BatchLineRow.line, BatchLineRow.custom_id, BatchLineRow.state,
                   BatchLineRow.status_code, BatchLineRow.request_id, BatchLineRow.answer,
                   BatchLineRow.error)
            .where(BatchLineRow.batch_id == batch_id).order_by(BatchLineRow.line)
        )).all()  # fmt: skip
    if any(state in ("pending", "running") for _, _, state, *_ in lines):
        return None
    output: list[bytes] = []
    errors: list[bytes] = []
    for _, custom_id, state, status, request_id, answer, error in lines:
        if state == "dropped" and error != "batch_expired":
            continue  # cancelled before it was sent: in neither file
        entry = _entry(custom_id, status, request_id, answer, error)
        (output if status == 200 else errors).append(entry)
    output_file = error_file = None
    if output:
        output_file = (await keep(db, store, tenant, f"{batch_id}_output.jsonl",
                                  "batch_output", b"".join(output))).id  # fmt: skip
    if errors:
        error_file = (await keep(db, store, tenant, f"{batch_id}_error.jsonl",
                                 "batch_output", b"".join(errors))).id  # fmt: skip
    async with db.sessions() as session, session.begin():
        batch = await session.get(BatchRow, batch_id, with_for_update=True)
        if batch is None or batch.status != "finalizing":
            return None
        now = utcnow()
        batch.output_file_id, batch.error_file_id = output_file, error_file
        if batch.cancelling_at is not None:
            batch.status, batch.cancelled_at = "cancelled", now
        elif batch.expired_at is not None:
            batch.status = "expired"
        else:
            batch.status, batch.completed_at = "completed", now
        return batch.status


def _entry(
    custom_id: str,
    status: int | None,
    request_id: str | None,
    answer: bytes | None,
    error: str | None,
) -> bytes:
    """One line of an output or error file, as OpenAI writes them; the engine's answer is
    put in as it came (no JSON of it is re-encoded)."""
    head = orjson.dumps({"id": f"batch_req_{secrets.token_hex(12)}", "custom_id": custom_id})
    if status is None or answer is None:
        code = "batch_expired" if error == "batch_expired" else "request_failed"
        failed = orjson.dumps({"code": code, "message": error or code})
        return head[:-1] + b',"response":null,"error":' + failed + b"}\n"
    response = orjson.dumps({"status_code": status, "request_id": request_id or ""})
    body = answer.strip()
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:  # not JSON (an error page, say): kept as a string
        body = orjson.dumps(answer.decode(errors="replace"))
    return head[:-1] + b',"response":' + response[:-1] + b',"body":' + body + b'},"error":null}\n'
