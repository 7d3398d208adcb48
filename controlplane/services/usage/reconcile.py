"""The ledger reconciled with the engines: per engine, the prompt and generation tokens it
counted itself (its `meter` records: `sglang:prompt_tokens_total` and
`sglang:generation_tokens_total` over each interval, agents/ledger/meter.py) against the
tokens of the served and carried records of it that ended within those intervals. Run by
the leader every period (`Reconciler`) and on demand (`GET /v1/usage/reconciliation`).

Drift is the ledger's sum less the engine's, as a part of the engine's. What an engine
works on that no tenant pays for shows as drift: an answer cut before its engine said its
usage (its record's tokens are what the client got), a call tried again elsewhere, a batch
answer given way, a stream carried on to another engine (one record for both engines'
work), the quality guard's canaries; so do the tokens of an answer still under way at an
interval's end, and those an engine counted before it was killed and not read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text

from controlplane.db.audit_rows import AuditEventRow
from controlplane.db.engine import Database
from controlplane.services.unit import current_revision

log = logging.getLogger(__name__)

DRIFT = 0.001  # a drift past this part is reported (an audit event, a warning)
ACTOR = "system:reconciler"
QUERY = text("""
WITH meters AS (
  SELECT worker, started_at, ended_at, prompt_tokens, completion_tokens FROM usage_records
  WHERE kind = 'meter' AND started_at >= :start AND ended_at <= :end),
engine AS (
  SELECT worker, min(started_at) AS since, max(ended_at) AS until, count(*) AS readings,
         sum(prompt_tokens) AS prompt, sum(completion_tokens) AS generation
  FROM meters GROUP BY worker),
records AS (
  SELECT * FROM usage_records
  WHERE kind IN ('served', 'carried') AND ended_at > :start AND ended_at <= :end
    AND started_at > :start - interval '1 day'),
calls AS (  -- each engine's call: a cascade's each, any other record whole
  SELECT worker, ended_at, prompt_tokens, completion_tokens FROM records WHERE calls IS NULL
  UNION ALL
  SELECT c ->> 'worker', r.ended_at, (c ->> 'prompt_tokens')::bigint,
         (c ->> 'completion_tokens')::bigint
  FROM records r CROSS JOIN LATERAL jsonb_array_elements(r.calls) AS c
  WHERE r.calls IS NOT NULL),
ledger AS (
  SELECT m.worker, count(*) AS requests, sum(r.prompt_tokens) AS prompt,
         sum(r.completion_tokens) AS generation
  FROM meters m JOIN calls r
    ON r.worker = m.worker AND r.ended_at > m.started_at AND r.ended_at <= m.ended_at
  GROUP BY m.worker)
SELECT e.worker, e.since, e.until, e.readings, e.prompt, e.generation,
       coalesce(l.requests, 0), coalesce(l.prompt, 0), coalesce(l.generation, 0)
FROM engine e LEFT JOIN ledger l USING (worker) ORDER BY e.worker
""")


def _drift(ledger: int, engine: int) -> float:
    if engine == 0:
        return 0.0 if ledger == 0 else 1.0
    return (ledger - engine) / engine


async def reconcile(db: Database, start: datetime, end: datetime) -> list[dict[str, Any]]:
    """Per engine metered within [start, end): what it counted, what the ledger holds."""
    async with db.sessions() as session:
        rows = (await session.execute(QUERY, {"start": start, "end": end})).all()
    out = []
    for worker, since, until, readings, prompt, generation, requests, l_prompt, l_gen in rows:
        out.append({
            "worker": worker, "from": since.isoformat(), "until": until.isoformat(),
            "readings": int(readings),
            "engine": {"prompt_tokens": int(prompt), "completion_tokens": int(generation)},
            "ledger": {"requests": int(requests), "prompt_tokens": int(l_prompt),
                       "completion_tokens": int(l_gen)},
            "drift": {"prompt_tokens": round(_drift(int(l_prompt), int(prompt)), 6),
                      "completion_tokens": round(_drift(int(l_gen), int(generation)), 6)},
        })  # fmt: skip
    return out


Observe = Callable[[list[dict[str, Any]]], None]


class Reconciler:
    """The leader's check, every `every_s`, of the period before last (the records of the
    last may still be on their way): each engine's drift to a metric; past DRIFT, an audit
    event (`usage.drift`, kind `worker`) and a warning."""

    def __init__(self, db: Database, every_s: float, observe: Observe | None = None) -> None:
        self.db, self.every_s, self.observe = db, every_s, observe
        self._last: datetime | None = None

    async def tick(self, now: datetime | None = None) -> list[dict[str, Any]] | None:
        now = now or datetime.now(UTC)
        if self._last is not None and (now - self._last).total_seconds() < self.every_s:
            return None
        self._last = now
        period = timedelta(seconds=self.every_s)
        found = await reconcile(self.db, now - 2 * period, now - period)
        if self.observe is not None:
            self.observe(found)
        drifted = [f for f in found if max(abs(v) for v in f["drift"].values()) > DRIFT]
        if drifted:
            async with self.db.sessions() as session, session.begin():
                revision = await current_revision(session)
                for f in drifted:
                    log.warning("the ledger drifts from engine %s's counters: %s", f["worker"],
                                f["drift"])  # fmt: skip
                    session.add(AuditEventRow(revision=revision, principal=ACTOR, kind="worker",
                                              name=f["worker"][:63], action="usage.drift",
                                              after=f))  # fmt: skip
        return found
