"""A batch line's state as the runner changes it: its answer recorded exactly once (the
batch's counts in the same transaction), a line given back to pending, and the backlog."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update

from controlplane.db.base import utcnow
from controlplane.db.batch_rows import BatchLineRow, BatchRow
from controlplane.db.engine import Database


def pending(batch: str, line: int, attempt: int) -> Any:
    """This attempt's line (if it still is) back to pending."""
    return (
        update(BatchLineRow)
        .where(BatchLineRow.batch_id == batch, BatchLineRow.line == line,
               BatchLineRow.state == "running", BatchLineRow.attempts == attempt)
        .values(state="pending", region=None, lease_until=None)
    )  # fmt: skip


async def backlog(db: Database) -> dict[str, int]:
    """Lines not answered yet, pending or running, in all batches."""
    async with db.sessions() as session:
        rows = await session.execute(
            select(BatchLineRow.state, func.count())
            .where(BatchLineRow.state.in_(("pending", "running")))
            .group_by(BatchLineRow.state)
        )
        return {str(state): int(n) for state, n in rows}


async def record(
    db: Database,
    batch: str,
    line: int,
    status: int | None,
    answer: bytes | None,
    request_id: str | None,
    error: str | None = None,
) -> bool:
    """The line's answer, if it has none yet, and the batch's counts with it: exactly once."""
    async with db.sessions() as session, session.begin():
        done = (await session.execute(
            update(BatchLineRow)
            .where(BatchLineRow.batch_id == batch, BatchLineRow.line == line,
                   BatchLineRow.state.in_(("pending", "running")))
            .values(state="done", status_code=status, answer=answer, request_id=request_id,
                    error=error, answered_at=utcnow(), lease_until=None)
            .returning(BatchLineRow.line)
        )).first()  # fmt: skip
        if done is None:
            return False
        ok = status == 200
        await session.execute(
            update(BatchRow)
            .where(BatchRow.id == batch)
            .values(completed=BatchRow.completed + int(ok), failed=BatchRow.failed + int(not ok))
        )
    return True
