"""The leader's batch runner: batches' lines sent to the regions that may serve them, as the
`batch` class, on the capacity the regions' own traffic leaves.

- **Where.** A line goes only to an active region that has a gateway, serves the line's
  model and lies in one of its tenant's jurisdictions. The control plane signs for the
  tenant: a short-lived assertion with its own key, which every region's snapshot trusts
  (meridian_pb/fleet/v1/assertion.py). The region checks the tenant's residency again.
- **How much.** Each region has a window of lines under way, which grows by one for each
  window of answers and halves when the region refuses a line for want of room (429 or
  503, with Retry-After: the runner then waits that long there). The regions' admission
  runs `batch` lines only where an engine would start them soon, within the slack others
  leave. So a region with idle capacity takes more; a busy one takes little, and its own
  traffic sheds batch first.
- **Follow the sun.** Where a region says its local time (`utc_offset_h`), lines go first
  to regions where it is night (22:00 to 06:00), whose windows also grow twice as fast and
  twice as far; in a region's working day (09:00 to 18:00) they grow at half the pace, to
  half as far. Slack still decides: a region at night whose traffic leaves none refuses.
- **At least once, recorded once.** A line is claimed (`running`, in a region, until its
  lease ends) before it is sent. Its answer is recorded only if the line is not done yet,
  with the batch's counts in the same transaction. A line whose region failed it goes back
  to `pending`, and so does one whose lease ran out, and every line that was running when
  a new leader took over. It may then run twice, but it is recorded once.
- **The end.** A batch whose lines are all done is finalized: its output file (the answers
  with status 200) and its error file (the others, and the lines its window left unrun:
  `batch_expired`) go to the object store, and it is `completed`, `expired` or `cancelled`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import httpx
from meridian_pb.fleet.v1 import assertion
from sqlalchemy import select, tuple_, update

from controlplane.db.access_rows import TenantRow
from controlplane.db.base import utcnow
from controlplane.db.batch_rows import BatchLineRow, BatchRow
from controlplane.db.engine import Database
from controlplane.db.fleet_rows import DeploymentRow, ModelRow, RegionRow
from controlplane.domain import RegionState
from controlplane.services.batches.answers import backlog, pending, record
from controlplane.services.batches.finish import finalize
from controlplane.services.batches.store import ObjectStore
from controlplane.services.sealing.keyring import Keyring

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 900.0  # a line waits in a region's admission up to batch's max_wait_s
LEASE = timedelta(seconds=REQUEST_TIMEOUT_S + 60)
FIRST_WINDOW, MAX_WINDOW = 4.0, 256.0  # lines under way in one region
MAX_INFLIGHT = 2048  # in all regions
MAX_FAILURES = 5  # a line regions fail this often (5xx: not refused, not unreachable) fails
UNREACHABLE_S = 30.0  # the longest a region that cannot be reached is left alone
BUSY_S, IDLE_S = 0.2, 1.0  # between ticks, with work and without
REFUSED_FOR_ROOM = (429, 503)


@dataclass(frozen=True)
class Target:
    """A region a line may go to."""

    name: str
    url: str
    jurisdiction: str
    models: frozenset[str]
    utc_offset_h: float | None = None


NIGHT, DAY = (22, 6), (9, 18)  # local hours: [from, to)


def sun_weight(utc_offset_h: float | None, now: datetime) -> float:
    """How much of batches a region takes by its local hour: 2 at night, 0.5 in its working
    day, 1 otherwise and where its time is not known."""
    if utc_offset_h is None:
        return 1.0
    hour = (now.hour + now.minute / 60 + utc_offset_h) % 24
    if hour >= NIGHT[0] or hour < NIGHT[1]:
        return 2.0
    return 0.5 if DAY[0] <= hour < DAY[1] else 1.0


def by_sun(targets: list[Target], now: datetime) -> list[Target]:
    """Regions where it is night first (by name among equals)."""
    return sorted(targets, key=lambda t: (-sun_weight(t.utc_offset_h, now), t.name))


@dataclass
class Window:
    """A region's lines under way, and how many it takes (AIMD)."""

    inflight: int = 0
    size: float = FIRST_WINDOW
    resume_at: float = 0.0  # after a refusal for room: not before (monotonic)
    unreachable: int = 0  # calls in a row it could not be reached
    weight: float = 1.0  # by its local hour (sun_weight)

    def answered(self) -> None:
        """One more line answered: the window grows by `weight` for each window of them."""
        self.size = min(MAX_WINDOW * self.weight, self.size + self.weight / self.size)


@dataclass(frozen=True)
class Open:
    """A batch with lines to send: its tenant's name and jurisdictions (None: any)."""

    id: str
    tenant: str
    jurisdictions: frozenset[str] | None
    endpoint: str


@dataclass
class BatchRunner:
    db: Database
    keyring: Keyring  # the control plane's signing key, which signs each line it sends
    store: ObjectStore
    clock: Callable[[], float] = time.monotonic
    windows: dict[str, Window] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _http: httpx.AsyncClient | None = None
    sent: Callable[[str, str], None] = lambda region, outcome: None
    backlog: Callable[[dict[str, int]], None] = lambda states: None

    async def run(self) -> None:
        """While this replica leads (cancelled when it no longer does)."""
        await self.reclaim()
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as http:
            self._http = http
            try:
                while True:
                    try:
                        worked = await self.tick()
                    except Exception:  # a loop boundary: log, back off, go on
                        log.exception("the batch runner failed; it will try again")
                        worked = False
                    await asyncio.sleep(BUSY_S if worked else IDLE_S)
            finally:
                for task in self._tasks:
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*self._tasks, return_exceptions=True)
                self._http = None

    async def reclaim(self) -> int:
        """Lines running under a leader before this one go back to pending (their answers,
        should they still come, are recorded if none has been)."""
        async with self.db.sessions() as session, session.begin():
            result = await session.execute(
                update(BatchLineRow)
                .where(BatchLineRow.state == "running")
                .values(state="pending", region=None, lease_until=None)
            )
        return int(getattr(result, "rowcount", 0) or 0)

    async def tick(self) -> bool:
        """Expire, finalize and send what can be; whether anything is under way or was sent."""
        batches = await self._open()
        self.backlog(await backlog(self.db))
        if not batches:
            return bool(self._tasks)
        wall = utcnow()
        targets = by_sun(await self._targets(), wall)
        now = self.clock()
        sent = 0
        for target in targets:
            window = self.windows.setdefault(target.name, Window())
            window.weight = sun_weight(target.utc_offset_h, wall)
            room = min(int(window.size) - window.inflight, MAX_INFLIGHT - len(self._tasks))
            if room <= 0 or now < window.resume_at:
                continue
            for batch in batches:
                if (
                    batch.jurisdictions is not None
                    and target.jurisdiction not in batch.jurisdictions
                ):
                    continue
                claimed = await self._claim(batch, target, room)
                for line, body, attempt in claimed:
                    self._spawn(self._send(target, window, batch, line, body, attempt))
                room -= len(claimed)
                sent += len(claimed)
                if room <= 0:
                    break
        return bool(sent or self._tasks)

    async def _open(self) -> list[Open]:
        """The batches to work on; those that expired have their unsent lines dropped, and
        those with nothing left are finalized."""
        now = utcnow()
        async with self.db.sessions() as session, session.begin():
            rows = (await session.execute(
                select(BatchRow, TenantRow.name, TenantRow.allowed_jurisdictions)
                .join(TenantRow, TenantRow.id == BatchRow.tenant_id)
                .where(BatchRow.status.in_(("in_progress", "cancelling", "finalizing")))
                .order_by(BatchRow.created_at)
            )).all()  # fmt: skip
            for batch, _, _ in rows:
                if batch.status == "in_progress" and batch.expires_at <= now:
                    await session.execute(
                        update(BatchLineRow)
                        .where(BatchLineRow.batch_id == batch.id, BatchLineRow.state == "pending")
                        .values(state="dropped", error="batch_expired", answered_at=now)
                    )
                    batch.expired_at = now
        out = []
        for batch, tenant, allowed in rows:
            if not await self._has_open_lines(batch.id):
                await finalize(self.db, self.store, batch.id)
            elif batch.status == "in_progress" and batch.expired_at is None:
                jurisdictions = frozenset(allowed) if allowed is not None else None
                out.append(Open(batch.id, tenant, jurisdictions, batch.endpoint))
        return out

    async def _has_open_lines(self, batch: str) -> bool:
        async with self.db.sessions() as session:
            found = await session.scalar(
                select(BatchLineRow.line)
                .where(BatchLineRow.batch_id == batch,
                       BatchLineRow.state.in_(("pending", "running")))
                .limit(1)
            )  # fmt: skip
        return found is not None

    async def _targets(self) -> list[Target]:
        async with self.db.sessions() as session:
            regions = (await session.execute(
                select(RegionRow.name, RegionRow.gateway_url, RegionRow.jurisdiction,
                       RegionRow.utc_offset_h)
                .where(RegionRow.state == RegionState.ACTIVE.value,
                       RegionRow.gateway_url.is_not(None))
                .order_by(RegionRow.name)
            )).all()  # fmt: skip
            served = (await session.execute(
                select(RegionRow.name, ModelRow.name)
                .join(DeploymentRow, DeploymentRow.region_id == RegionRow.id)
                .join(ModelRow, ModelRow.id == DeploymentRow.model_id)
            )).all()  # fmt: skip
        models: dict[str, set[str]] = {}
        for region, model in served:
            models.setdefault(region, set()).add(model)
        return [
            Target(
                name, str(url).rstrip("/"), jurisdiction, frozenset(models.get(name, ())), offset
            )
            for name, url, jurisdiction, offset in regions
            if models.get(name)
        ]

    async def _claim(self, batch: Open, target: Target, room: int) -> list[tuple[int, bytes, int]]:
        """Up to `room` of the batch's lines that the region serves, marked running there:
        (line, body, attempt)."""
        now = utcnow()
        pick = (
            select(BatchLineRow.batch_id, BatchLineRow.line)
            .where(
                BatchLineRow.batch_id == batch.id,
                BatchLineRow.model.in_(target.models),
                (BatchLineRow.state == "pending")
                | ((BatchLineRow.state == "running") & (BatchLineRow.lease_until < now)),
            )
            .order_by(BatchLineRow.line)
            .limit(room)
            .with_for_update(skip_locked=True)
        )
        async with self.db.sessions() as session, session.begin():
            claimed = (await session.execute(
                update(BatchLineRow)
                .where(tuple_(BatchLineRow.batch_id, BatchLineRow.line).in_(pick))
                .values(state="running", region=target.name, lease_until=now + LEASE,
                        attempts=BatchLineRow.attempts + 1)
                .returning(BatchLineRow.line, BatchLineRow.body, BatchLineRow.attempts)
                .execution_options(synchronize_session=False)
            )).all()  # fmt: skip
        return [(line, body, attempts) for line, body, attempts in claimed]

    def _spawn(self, call: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(call)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(
        self, target: Target, window: Window, batch: Open, line: int, body: bytes, attempt: int
    ) -> None:
        assert self._http is not None
        rid = f"{batch.id}-{line}-{attempt}"
        window.inflight += 1
        try:
            headers = await self._headers(target, batch, rid, body)
            answer = await self._http.post(target.url + batch.endpoint, content=body,
                                           headers=headers)  # fmt: skip
        except httpx.HTTPError as error:  # the region is gone: its lines go elsewhere
            self.sent(target.name, "unreachable")
            window.unreachable += 1
            window.size = 1.0
            window.resume_at = self.clock() + min(UNREACHABLE_S, 0.5 * 2**window.unreachable)
            log.info("batch %s line %s: %s unreachable: %s", batch.id, line, target.name, error)
            await self._release(batch.id, line, attempt)
            return
        finally:
            window.inflight -= 1
        window.unreachable = 0
        status = answer.status_code
        outcome = (
            "refused" if status in REFUSED_FOR_ROOM else "failed" if status >= 500 else "answered"
        )
        self.sent(target.name, outcome)
        if status in REFUSED_FOR_ROOM:
            window.size = max(1.0, window.size / 2)
            retry = answer.headers.get("Retry-After", "1")
            window.resume_at = self.clock() + min(30.0, float(retry) if retry.isdigit() else 1.0)
            await self._release(batch.id, line, attempt)
        elif status >= 500:
            await self._failed(batch.id, line, attempt, f"{target.name} answered {status}")
        else:
            if status == 200:
                window.answered()
            await record(self.db, batch.id, line, status, answer.content, rid)

    async def _headers(self, target: Target, batch: Open, rid: str, body: bytes) -> dict[str, str]:
        key_id, key = await self.keyring.signer()
        signed = assertion.payload(
            origin=assertion.CONTROL_PLANE, audience=target.name, key_id=key_id,
            tenant=batch.tenant, request_id=rid, reason="batch", body=body, debug=False,
            waited_ms=0.0, service_class="batch", now=time.time(),
        )  # fmt: skip
        return {
            "Content-Type": "application/json",
            "X-Request-ID": rid,
            assertion.HEADER: assertion.header(signed, key.sign(signed)),
        }

    async def _release(self, batch: str, line: int, attempt: int) -> None:
        """Back to pending: sent again, to whichever region has room first."""
        async with self.db.sessions() as session, session.begin():
            await session.execute(pending(batch, line, attempt))

    async def _failed(self, batch: str, line: int, attempt: int, why: str) -> None:
        """A region failed it: sent again, until it has failed MAX_FAILURES times."""
        log.info("batch %s line %s, attempt %s: %s", batch, line, attempt, why)
        async with self.db.sessions() as session, session.begin():
            failures = await session.scalar(
                update(BatchLineRow)
                .where(BatchLineRow.batch_id == batch, BatchLineRow.line == line,
                       BatchLineRow.state == "running", BatchLineRow.attempts == attempt)
                .values(failures=BatchLineRow.failures + 1)
                .returning(BatchLineRow.failures)
            )  # fmt: skip
            if failures is not None and failures < MAX_FAILURES:
                await session.execute(pending(batch, line, attempt))
        if failures is not None and failures >= MAX_FAILURES:
            await record(self.db, batch, line, None, None, None, why)
