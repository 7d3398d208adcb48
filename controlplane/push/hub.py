"""The newest snapshot of every region, recompiled when the revision moves.

A region's snapshot is replaced only when its content digest changes, so a commit that
does not touch a region sends that region's agents nothing. Each region has an event that
is set (and replaced) when its snapshot changes; the streams of that region wait on it.

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
from opentelemetry.trace import SpanContext, Tracer
from sqlalchemy import select

from controlplane.db.agent_rows import RegionLoadRow
from controlplane.db.engine import Database
from controlplane.push.wire import peer_load_message, to_wire
from controlplane.services.fleet_state import read_fleet_state
from controlplane.services.rollouts import store
from controlplane.services.rollouts.compose import Holdings, Intent, compose
from controlplane.services.unit import current_revision
from controlplane.snapshot import FleetState, compile_region

log = logging.getLogger(__name__)


Held = tuple[str, int | None]  # a region, and the intent revision held there (None: newest)


@dataclass(frozen=True)
class RegionFeed:
    """What a region's streams send: the snapshot, encoded once for all of them."""

    revision: int
    digest: str
    message: bytes  # a serialized ControlMessage
    trace: SpanContext | None = None  # the compile's span, parent of each send's


class SnapshotHub:
    def __init__(self, db: Database, *, poll_s: float = 2.0, tracer: Tracer | None = None) -> None:
        self._db = db
        self.tracer = tracer
        self._poll_s = poll_s
        self._snapshots: dict[Held, pb.Snapshot] = {}
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
            if state.revision <= self.revision:
                return
            span = None
            if self.tracer is not None:
                span = self.tracer.start_span(
                    f"compile revision {state.revision}", start_time=started_ns
                )
            self._peer_load = await self._read_peer_loads()
            changed: set[str] = set()
            gone = sorted({k[0] for k in self._snapshots} - set(state.regions))
            by_digest = {(k[0], m.digest): k for k, m in self._snapshots.items()}
            snapshots: dict[Held, pb.Snapshot] = {}
            feeds: dict[Held, RegionFeed] = {}
            for region in state.regions:
                for held in sorted(self._holdings.in_region(state, region), key=str):
                    intent = self._intents.get(held) if held is not None else None
                    fleet = state if intent is None else compose(state, intent)
                    message = to_wire(compile_region(fleet, region))
                    key = (region, held)
                    # the same content under another holding (a region pinned as a rollout
                    # begins) keeps what was sent: its agents get nothing new
                    same = by_digest.get((region, message.digest))
                    if same is not None and same in self._feeds:
                        snapshots[key], feeds[key] = self._snapshots[same], self._feeds[same]
                    else:
                        snapshots[key] = message
                        changed.add(region)
            changed |= {k[0] for k in self._snapshots if k not in snapshots} - set(gone)
            self._snapshots, self._feeds = snapshots, feeds
            trace = span.get_span_context() if span is not None else None
            for key in self._snapshots:
                if key not in self._feeds:
                    self._encode(key, trace)
            self.revision = state.revision
            self.last_compile_s = time.perf_counter() - started
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
                    "revision %s compiled in %.3f s; changes %s",
                    state.revision,
                    self.last_compile_s,
                    ", ".join([*sorted(changed), *gone]),
                    extra={"revision": state.revision, "compile_s": self.last_compile_s},
                )

    async def _load(self) -> FleetState:
        """The fleet, what each target holds, and the intents held, in one transaction."""
        async with self._db.sessions() as session, session.begin():
            await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            state = await read_fleet_state(session)
            holdings = await store.read_holdings(session)
            held = {*holdings.regions.values(), *holdings.nodes.values()}
            self._intents.update(await store.read_intents(session, held - set(self._intents)))
        self._holdings = holdings
        return state

    def _encode(self, key: Held, trace: SpanContext | None = None) -> None:
        region = key[0]
        snapshot = pb.Snapshot()
        snapshot.CopyFrom(self._snapshots[key])
        snapshot.peer_load.extend(v for k, v in sorted(self._peer_load.items()) if k != region)
        message = pb.ControlMessage(snapshot=snapshot).SerializeToString()
        old = self._feeds.get(key)
        if trace is None and old is not None and old.revision == snapshot.revision:
            trace = old.trace  # peer load refreshed: the same revision's trace
        self._feeds[key] = RegionFeed(snapshot.revision, snapshot.digest, message, trace)

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
                for key in self._snapshots:
                    self._encode(key)

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
