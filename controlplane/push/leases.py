"""The leases of this replica's agents, read from PostgreSQL and sent on each agent's stream.

Every `poll_s` the replica reads the lease rows' versions, and the rows that moved; each
stream then sends its agent only the leases that changed for it. Every lease an agent holds
is good for `ttl_s` from the message that carried or renewed it, so each stream also sends a
renewal (a message with no change) every `renew_s` while its agent holds leases: the feed
wakes the streams of the agents that hold some every `renew_s / 2`, and no other (a stream
waits on its own event alone, with no timer: thousands of them cost nothing idle). A replica
that has not read the leases for half the ttl renews nothing: its agents' leases run out and
they fall back to their static shares, rather than go on with leases the leader may already
have given to others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from meridian_pb.fleet.v1 import fleet_pb2 as pb
from sqlalchemy import select

from controlplane.db.engine import Database
from controlplane.db.quota_rows import QuotaLeaseRow

log = logging.getLogger(__name__)
NodeLeases = dict[str, pb.Lease]  # tenant -> the node's lease


class LeaseFeed:
    def __init__(
        self, db: Database, *, ttl_s: float, poll_s: float = 0.5, renew_s: float | None = None
    ) -> None:
        self._db = db
        self.ttl_s = ttl_s
        self._poll_s = poll_s
        self.renew_s = renew_s if renew_s is not None else ttl_s / 4
        self._versions: dict[str, int] = {}
        self._rows: dict[str, dict[str, Any]] = {}
        self._nodes: dict[str, NodeLeases] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._read_at = -1e9  # monotonic
        self._woke_at = -1e9  # monotonic: when the holders' streams were last woken to renew
        self._task: asyncio.Task[None] | None = None

    def of(self, node: str) -> NodeLeases:
        return self._nodes.get(node, {})

    def fresh(self) -> bool:
        return time.monotonic() - self._read_at < self.ttl_s / 2

    def changed(self, node: str) -> asyncio.Event:
        return self._changed.setdefault(node, asyncio.Event())

    async def refresh(self) -> None:
        async with self._db.sessions() as session:
            versions = dict(
                (t, v) for t, v in await session.execute(
                    select(QuotaLeaseRow.tenant, QuotaLeaseRow.version))
            )  # fmt: skip
            moved = [t for t, v in versions.items() if self._versions.get(t) != v]
            if moved:
                rows = await session.execute(
                    select(QuotaLeaseRow.tenant, QuotaLeaseRow.data).where(
                        QuotaLeaseRow.tenant.in_(moved)
                    )
                )
                self._rows.update({t: d for t, d in rows})
        self._read_at = time.monotonic()
        gone = [t for t in self._rows if t not in versions]
        if self._read_at - self._woke_at >= self.renew_s / 2:
            self._woke_at = self._read_at
            for node in self._nodes:
                self._wake(node)
        if not moved and not gone:
            return
        for tenant in gone:
            del self._rows[tenant]
        self._versions = versions
        nodes: dict[str, NodeLeases] = {}
        for tenant, doc in self._rows.items():
            quota = doc.get("quota", {})
            for node, lease in doc.get("leases", {}).items():
                nodes.setdefault(node, {})[tenant] = _lease(tenant, lease, quota)
            for budget, spend in sorted(doc.get("spend", {}).items()):
                for node, held in spend["leases"].items():
                    if held.get("seq"):  # a lease was made for it (else: its static part)
                        told = nodes.setdefault(node, {})
                        lease = told.setdefault(tenant, pb.Lease(tenant=tenant))
                        lease.spend.add(
                            budget=budget, window=spend["window"], limit_nanos=spend["limit"],
                            ceiling_nanos=held["ceiling"], seq=held["seq"],
                            fleet_used_nanos=held.get("fleet", 0),
                        )  # fmt: skip
        for node in set(nodes) | set(self._nodes):
            if nodes.get(node) != self._nodes.get(node):
                self._wake(node)
        self._nodes = nodes

    def _wake(self, node: str) -> None:
        event = self._changed.pop(node, None)
        if event is not None:
            event.set()

    async def serve(self, node: str, write: Callable[[pb.Leases], Awaitable[None]]) -> None:
        """Send one agent its leases for as long as its stream lasts."""
        sent: NodeLeases = {}
        renewed = 0.0
        while True:
            changed = self.changed(node)
            now = time.monotonic()
            current = self.of(node)
            if self.fresh():
                update = [lease for t, lease in sorted(current.items()) if sent.get(t) != lease]
                dropped = sorted(t for t in sent if t not in current)
                if update or dropped or (current and now - renewed >= self.renew_s):
                    await write(pb.Leases(ttl_s=self.ttl_s, set=update, dropped=dropped))
                    sent, renewed = dict(current), now
            await changed.wait()

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:
                log.exception("reading the quota leases failed; will retry")
            await asyncio.sleep(self._poll_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="lease-feed")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def _lease(tenant: str, lease: dict[str, Any], quota: dict[str, Any]) -> pb.Lease:
    out = pb.Lease(tenant=tenant)
    for dim in ("requests_per_minute", "tokens_per_minute", "concurrent_requests"):
        if lease.get(dim) is not None:
            setattr(out, dim, float(lease[dim]))
        if quota.get(dim) is not None:
            setattr(out, f"quota_{dim}", int(quota[dim]))
    return out
