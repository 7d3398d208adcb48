"""The newest snapshot of every region, recompiled when the revision moves.

A revision is read and compiled only where it changed (services/fleet_state.py's reader,
push/parts.py's compiler). A region's feed is replaced only when its content changes, so a
commit that does not touch a region sends that region's agents nothing. Each region has an
event that is set (and replaced) when its feed changes; the streams of that region wait on
it. A feed keeps the one before it, so that a node holding that one is sent a delta.

While a rollout runs, a region's targets may hold different intents (see
services/rollouts/compose.py): the region then has one snapshot per intent held, and each
stream sends its node the one that node holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.content import combine, plan_digest, shared_digest
from meridian_pb.fleet.v1.delta import diff
from meridian_pb.fleet.v1.framing import (
    DELTA,
    DELTA_BASE_DIGEST,
    DELTA_CHANGES,
    DELTA_DIGEST,
    DELTA_REPLACED,
    DIGEST,
    NODES,
    SNAPSHOT,
    field,
)
from opentelemetry.trace import SpanContext, Tracer
from sqlalchemy import select

from controlplane.db.agent_rows import RegionLoadRow
from controlplane.db.engine import Database
from controlplane.metrics import ControlPlaneMetrics
from controlplane.push.parts import PartsCompiler, RegionParts
from controlplane.push.wire import peer_load_message
from controlplane.services.fleet_state import FleetReader
from controlplane.services.rollouts import store
from controlplane.services.rollouts.compose import Holdings, Intent, compose
from controlplane.services.sealing.sealer import Sealer
from controlplane.services.sealing.signing import Seeds
from controlplane.services.unit import current_revision
from controlplane.snapshot import FleetState

log = logging.getLogger(__name__)


Held = tuple[str, int | None]  # a region, and the intent revision held there (None: newest)


@dataclass(frozen=True)
class Plan:
    message: pb.NodePlan
    encoded: bytes
    digest: bytes


def content_of(shared: bytes, plans: dict[str, Plan]) -> str:
    """The region's content, all nodes' plans with the shared part: what, unchanged, needs
    no new message."""
    return combine(shared, (p.digest for _, p in sorted(plans.items())))


class RegionFeed:
    """What a region's streams send: the shared part encoded once for all of its nodes, each
    node's plan encoded once, and the delta from the feed before it."""

    def __init__(
        self,
        revision: int,
        parts: RegionParts,
        shared: bytes,  # shared_digest(parts.shared)
        plans: dict[str, Plan],
        base: RegionFeed | None,
        trace: SpanContext | None,
    ) -> None:
        self.revision, self.trace, self.plans = revision, trace, plans
        self.shared = parts.shared
        self.shared_digest = shared
        self.content = content_of(self.shared_digest, plans)
        self._shared_bytes = parts.shared.SerializeToString()
        self.base = base
        self._delta_bytes = b""
        if base is not None:
            base.base = None  # one step back is enough: an agent further behind gets it all
            self._delta_bytes = diff(base.shared, parts.shared).SerializeToString()
        self._load = b""

    def with_load(self, peer_load: list[pb.PeerLoad]) -> None:
        """The peer regions' load, which every message carries as of its sending."""
        self._load = pb.Snapshot(peer_load=peer_load).SerializeToString()

    def digest(self, node: str) -> str:
        plan = self.plans.get(node)
        return combine(self.shared_digest, [plan.digest] if plan is not None else [])

    def full(self, node: str) -> bytes:
        """The node's snapshot, as a ControlMessage."""
        plan = self.plans.get(node)
        body = self._shared_bytes + self._load
        if plan is not None:
            body += field(NODES, plan.encoded)
        return field(SNAPSHOT, body + field(DIGEST, self.digest(node).encode()))

    def delta(self, node: str, held: tuple[int, str]) -> bytes | None:
        """The node's delta from what it holds, as a ControlMessage; None unless it holds
        the revision before this one."""
        base = self.base
        if base is None or held != (base.revision, base.digest(node)):
            return None
        plan, before = self.plans.get(node), base.plans.get(node)
        body = self._delta_bytes + field(DELTA_CHANGES, self._load)  # peer_load: replaced
        body += field(DELTA_BASE_DIGEST, held[1].encode())
        body += field(DELTA_DIGEST, self.digest(node).encode())
        if (plan and plan.digest) != (before and before.digest):
            changes = field(NODES, plan.encoded) if plan is not None else b""
            body += field(DELTA_CHANGES, changes) + field(DELTA_REPLACED, b"nodes")
        return field(DELTA, body)


class SnapshotHub:
    def __init__(
        self,
        db: Database,
        *,
        poll_s: float = 2.0,
        tracer: Tracer | None = None,
        metrics: ControlPlaneMetrics | None = None,
        sealer: Sealer | None = None,
    ) -> None:
        self._db = db
        # opens the seed each region signs with (without: snapshots carry no signing key)
        self._seeds = Seeds(sealer) if sealer is not None else None
        self.tracer = tracer
        self._metrics = metrics
        self._poll_s = poll_s
        self._reader = FleetReader()
        self._compiler = PartsCompiler()
        self._plans: dict[tuple[Held, str], Plan] = {}
        self._feeds: dict[Held, RegionFeed] = {}
        self._holdings = Holdings()
        self._intents: dict[int, Intent] = {}  # immutable once written: kept
        self._changed: dict[str, asyncio.Event] = {}
        self._peer_load: dict[str, pb.PeerLoad] = {}
        self._lock = asyncio.Lock()
        self._wanted = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.revision = -1
        self.last_compile_s = 0.0
        self.last_read_s = 0.0  # of it, reading PostgreSQL

    def feed(self, region: str, node: str | None = None) -> RegionFeed | None:
        """What a node of the region is sent: the snapshot of the intent it holds."""
        held = self._holdings.of_node(node, region) if node is not None else None
        return self._feeds.get((region, held)) or self._feeds.get((region, None))

    def changed(self, region: str) -> asyncio.Event:
        """The event that is set the next time this region's snapshot changes (or goes)."""
        return self._changed.setdefault(region, asyncio.Event())

    async def announce(self, revision: int) -> None:
        """A revision was committed (here or on another replica): recompile soon.

        Returns at once, so a REST write does not wait for the compile; announcements that
        arrive while a compile runs are coalesced into one more compile.
        """
        if revision > self.revision:
            self._wanted.set()

    async def _compile_when_wanted(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            try:
                await self.refresh()
            except Exception:
                log.exception("compiling snapshots failed; the poll will retry")

    async def refresh(self) -> None:
        async with self._lock:
            started, started_ns = time.perf_counter(), time.time_ns()
            state = await self._load()
            self.last_read_s = time.perf_counter() - started
            if self._metrics is not None:
                self._metrics.compiles.labels("read").inc(self.last_read_s)
            if state.revision <= self.revision:
                return
            span = None
            if self.tracer is not None:
                span = self.tracer.start_span(
                    f"compile revision {state.revision}", start_time=started_ns
                )
            trace = span.get_span_context() if span is not None else None
            self._peer_load = await self._read_peer_loads()
            gone = sorted({k[0] for k in self._feeds} - set(state.regions))
            changed = self._compile(state, trace)  # the new feeds: of existing regions only
            self.revision = state.revision
            self.last_compile_s = time.perf_counter() - started
            if self._metrics is not None:
                self._metrics.compiles.labels("compile").inc(self.last_compile_s - self.last_read_s)
            if span is not None:
                regions = [*sorted(changed), *gone]
                span.set_attributes(
                    {"meridian.revision": state.revision, "meridian.regions_changed": regions}
                )
                span.end()
            for region in [*sorted(changed), *gone]:
                self._wake(region)
            if changed or gone:
                log.info(
                    "revision %s compiled in %.3f s (%.3f s reading); changes %s",
                    state.revision,
                    self.last_compile_s,
                    self.last_read_s,
                    ", ".join([*sorted(changed), *gone]),
                    extra={"revision": state.revision, "compile_s": self.last_compile_s},
                )

    def _compile(self, state: FleetState, trace: SpanContext | None) -> set[str]:
        """Each region's feed for each intent held there; the regions whose content moved."""
        wanted: dict[int | None, list[str]] = {}
        for region in state.regions:
            for held in self._holdings.in_region(state, region):
                wanted.setdefault(held, []).append(region)
        for label in {k[1] for k in self._feeds} - wanted.keys():
            self._compiler.forget(label)
        feeds: dict[Held, RegionFeed] = {}
        changed: set[str] = set()
        by_content = {(k[0], f.content): f for k, f in self._feeds.items()}
        for held, regions in sorted(wanted.items(), key=lambda item: str(item[0])):
            intent = self._intents.get(held) if held is not None else None
            fleet = state if intent is None else compose(state, intent)
            for region, parts in self._compiler.compile(fleet, held, regions).items():
                key = (region, held)
                plans = self._plans_of(key, parts)
                shared = shared_digest(parts.shared)
                # the same content under another holding (a region pinned as a rollout
                # begins) keeps what was sent: its agents get nothing new
                same = by_content.get((region, content_of(shared, plans)))
                if same is not None:
                    feeds[key] = same
                    continue
                feed = RegionFeed(state.revision, parts, shared, plans, self._feeds.get(key), trace)
                feed.with_load(self._loads_for(region))
                feeds[key] = feed
                changed.add(region)
        changed |= {k[0] for k in self._feeds if k not in feeds and k[0] in state.regions}
        self._feeds = feeds
        live = {(k, node) for k in feeds for node in feeds[k].plans}
        self._plans = {k: p for k, p in self._plans.items() if k in live}
        return changed

    def _plans_of(self, key: Held, parts: RegionParts) -> dict[str, Plan]:
        """Each node's plan, encoded and hashed again only when it is a new one."""
        plans = {}
        for node, message in parts.plans.items():
            known = self._plans.get((key, node))
            if known is None or known.message is not message:
                encoded = message.SerializeToString()
                known = Plan(message, encoded, plan_digest(message))
                self._plans[(key, node)] = known
            plans[node] = known
        return plans

    def _loads_for(self, region: str) -> list[pb.PeerLoad]:
        return [v for k, v in sorted(self._peer_load.items()) if k != region]

    async def _load(self) -> FleetState:
        """The fleet, what each target holds, and the intents held, in one transaction."""
        async with self._db.sessions() as session, session.begin():
            await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            state = await self._reader.read(session)
            if self._seeds is not None:
                state = await self._seeds.fill(session, state)
            holdings = await store.read_holdings(session)
            held = {*holdings.regions.values(), *holdings.nodes.values()}
            self._intents.update(await store.read_intents(session, held - set(self._intents)))
        self._holdings = holdings
        return state

    def _wake(self, region: str) -> None:
        event = self._changed.pop(region, None)
        if event is not None:
            event.set()

    async def _read_peer_loads(self) -> dict[str, pb.PeerLoad]:
        async with self._db.sessions() as session:
            rows = (await session.execute(select(RegionLoadRow))).unique().scalars()
            return {row.region.name: peer_load_message(row.data) for row in rows}

    async def load_peer_loads(self) -> None:
        """Take the leader's newest rollup; later pushes carry it to the peer regions."""
        loads = await self._read_peer_loads()
        if loads != self._peer_load:
            async with self._lock:
                self._peer_load = loads
                for (region, _), feed in self._feeds.items():
                    feed.with_load(self._loads_for(region))

    async def _poll(self) -> None:
        """Level-triggered safety net: notice revisions whose announcement was lost."""
        while True:
            try:
                async with self._db.sessions() as session:
                    revision = await current_revision(session)
                if revision > self.revision:
                    await self.refresh()
                await self.load_peer_loads()
            except Exception:
                log.exception("polling the revision failed; will retry")
            await asyncio.sleep(self._poll_s)

    async def start(self) -> None:
        await self.refresh()
        self._tasks = [
            asyncio.create_task(self._compile_when_wanted(), name="snapshot-hub-compile"),
            asyncio.create_task(self._poll(), name="snapshot-hub-poll"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
