"""The planner as operators see and steer it: what it last decided, and pause or resume (kept
in PostgreSQL, so that every replica shows it and a new leader honours it; audited)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func

from controlplane.db.audit_rows import AuditEventRow
from controlplane.db.engine import Database
from controlplane.services.planner.loop import KIND, PlannerConfig, read_state, state_row
from controlplane.services.unit import current_revision


async def view(db: Database, config: PlannerConfig) -> dict[str, Any]:
    async with db.sessions() as session:
        row = await read_state(session)
        return {
            "mode": str(config.mode),
            "paused": row.paused,
            "paused_by": row.paused_by,
            "paused_at": row.paused_at.isoformat() if row.paused_at else None,
            "period_s": config.period_s,
            "cooldown_s": config.cooldown_s,
            "max_changes": config.max_changes,
            "gpu_budget": config.gpu_budget,
            "money_budget": config.money_budget,
            "last_run_at": row.last_run_at.isoformat() if row.last_run_at else None,
            "last_run_revision": row.last_run_revision,
            "decisions": row.decisions,
        }


async def pause(db: Database, actor: str, paused: bool) -> None:
    """Pause (plans are advice only) or resume; a no-op when it is so already."""
    async with db.sessions() as session, session.begin():
        row = await state_row(session, lock=True)
        if row.paused == paused:
            return
        row.paused = paused
        row.paused_by, row.paused_at = (actor, func.now()) if paused else (None, None)
        session.add(AuditEventRow(
            revision=await current_revision(session), principal=actor,
            action="pause" if paused else "resume", kind=KIND, name="planner", after=None,
        ))  # fmt: skip
