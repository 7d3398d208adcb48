"""The Fleet service: Register, and the Sync stream that pushes snapshots to one agent."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc
from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.demand import TenantDemand
from meridian_pb.fleet.v1.framing import STREAM_ACCEPTED
from opentelemetry.trace import SpanKind
from sqlalchemy.exc import SQLAlchemyError

from controlplane.coord.base import AgentPresence, Coordinator
from controlplane.db.engine import Database
from controlplane.errors import (
    HeartbeatMissed,
    InvalidCredential,
    ProtocolViolation,
    WrongRegion,
)
from controlplane.metrics import ControlPlaneMetrics
from controlplane.push.hub import RegionFeed, SnapshotHub
from controlplane.push.leases import LeaseFeed
from controlplane.push.status import guarded
from controlplane.push.wire import telemetry_doc
from controlplane.services import agents
from controlplane.services.kind import parse
from controlplane.services.quotas.demand import DemandBook, NodeDemand
from controlplane.services.reports import NodeReports
from controlplane.services.revisions import RevisionFeed
from controlplane.services.usage.store import UsageStore
from controlplane.tracing import child_of

log = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["Fleet"].full_name
Context = grpc.aio.ServicerContext[Any, Any]


@dataclass
class StreamState:
    """What one stream knows of its agent."""

    revision: int  # the revision the agent runs
    digest: str  # ... and that snapshot's content digest
    sent: int = 0  # the newest revision sent on this stream
    sent_digest: str = ""
    sent_at: float = 0.0  # monotonic: when it was written
    writing: asyncio.Lock = field(default_factory=asyncio.Lock)  # one write at a time
    # what the agent holds once it has taken all that was sent: the base of the next delta
    holds: tuple[int, str] = (0, "")
    # usage records received, to store and acknowledge in order (see `_store_usage`)
    usage: asyncio.Queue[pb.UsageBatch] = field(default_factory=asyncio.Queue)
    # the agent's records stored without a gap, through this sequence number (None: none yet
    # on this stream): an acknowledgement never covers one that was not stored
    usage_through: int | None = None

    def __post_init__(self) -> None:
        self.holds = (self.revision, self.digest)


def bearer(context: Context) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value.removeprefix("Bearer ").strip()
    raise InvalidCredential("send the agent credential as `authorization: Bearer <credential>`")


class FleetService:
    def __init__(
        self,
        db: Database,
        hub: SnapshotHub,
        reports: NodeReports,
        coordinator: Coordinator,
        feed: RevisionFeed,
        *,
        heartbeat_timeout_s: float,
        metrics: ControlPlaneMetrics | None = None,
        leases: LeaseFeed | None = None,
        demand: DemandBook | None = None,
        usage: UsageStore | None = None,
    ) -> None:
        self._db = db
        self._usage = usage
        self._hub = hub
        self._leases = leases
        self._demand = demand
        self._reports = reports
        self._coord = coordinator
        self._feed = feed
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._metrics = metrics or ControlPlaneMetrics()

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Register": grpc.unary_unary_rpc_method_handler(
                    self.register,
                    request_deserializer=pb.RegisterRequest.FromString,
                    response_serializer=pb.RegisterResponse.SerializeToString,
                ),
                # Snapshots are encoded once per region and written as bytes to every stream.
                "Sync": grpc.stream_stream_rpc_method_handler(
                    self.sync,
                    request_deserializer=pb.AgentMessage.FromString,
                    response_serializer=bytes,
                ),
            },
        )

    async def register(self, request: pb.RegisterRequest, context: Context) -> pb.RegisterResponse:
        async with guarded(context):
            given = parse(
                agents.AgentRegistration,
                {
                    "region": request.region,
                    "node": request.node or None,
                    "hostname": request.hostname,
                    "gpus": [
                        {"index": g.index, "model": g.model, "memory_gb": g.memory_gb}
                        for g in request.gpus
                    ],
                    "agent_version": request.agent_version,
                },
            )
            done = await agents.register(self._db, request.bootstrap_token, given)
            log.info(
                "agent %s registered for node %s",
                done.agent,
                done.node,
                extra={"region": done.region, "node_id": done.node},
            )
            await self._feed.published(done.revision)
            return pb.RegisterResponse(
                agent_id=done.agent, credential=done.credential, region=done.region, node=done.node
            )
        raise AssertionError("unreachable")  # guarded() aborts

    async def sync(self, requests: object, context: Context) -> None:
        async with guarded(context):
            identity = await agents.authenticate(self._db, bearer(context))
            first = await self._read(context)
            if first is None or first.WhichOneof("body") != "hello":
                raise ProtocolViolation("the first message of a stream must be Hello")
            hello = first.hello
            if hello.region and hello.region != identity.region:
                raise WrongRegion(
                    f"this agent belongs to region {identity.region!r}, not {hello.region!r}"
                )
            if hello.node and hello.node != identity.node:
                raise WrongRegion(f"this credential is for node {identity.node!r}")
            presence = AgentPresence(
                identity.node, identity.region, self._coord.me.id, secrets.token_hex(4), time.time()
            )
            state = StreamState(hello.revision, hello.digest)
            await self._coord.agent_connected(presence)
            connected = self._metrics.connected.labels(identity.region)
            connected.inc()
            try:
                # Tells the agent at once that its Hello was taken, even if nothing is newer.
                await context.send_initial_metadata(((STREAM_ACCEPTED, "1"),))
                await self._serve(context, identity, state)
            finally:
                connected.dec()
                await self._coord.agent_disconnected(presence)

    async def _serve(self, context: Context, who: agents.AgentIdentity, state: StreamState) -> None:
        tasks = {
            asyncio.create_task(self._push(context, who, state)),
            asyncio.create_task(self._listen(context, who, state)),
        }
        if self._leases is not None:
            tasks.add(asyncio.create_task(self._send_leases(context, who, state, self._leases)))
        if self._usage is not None:
            tasks.add(asyncio.create_task(self._store_usage(context, who, state, self._usage)))
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._demand is not None:
                self._demand.gone(who.node)
        for task in done:
            task.result()

    async def _send_leases(
        self, context: Context, who: agents.AgentIdentity, state: StreamState, feed: LeaseFeed
    ) -> None:
        async def write(leases: pb.Leases) -> None:
            message = pb.ControlMessage(leases=leases).SerializeToString()
            async with state.writing:
                await context.write(message)

        await feed.serve(who.node, write)

    async def _store_usage(
        self, context: Context, who: agents.AgentIdentity, state: StreamState, store: UsageStore
    ) -> None:
        """Each batch of usage records stored, then acknowledged through its last. A batch
        that cannot be stored (the database away) is not acknowledged, nor is any after it
        (an acknowledgement covers every record before it): the agent, hearing nothing, sends
        again from its last acknowledged, and what was stored is stored once."""
        while True:
            batch = await state.usage.get()
            if not batch.records:
                continue
            first, last = batch.records[0].seq, batch.records[-1].seq
            if state.usage_through is None:  # a stream begins where the agent was acknowledged
                state.usage_through = first - 1
            try:
                stored = await store.store(batch.records, who.region, who.node)
            except (OSError, SQLAlchemyError) as error:
                self._metrics.usage_failed.labels(who.region).inc()
                log.warning("usage records of node %s not stored: %s", who.node, error,
                            extra={"node_id": who.node, "region": who.region})  # fmt: skip
                continue
            self._metrics.usage_stored.labels(who.region).inc(stored)
            if first > state.usage_through + 1:
                continue  # after a batch not stored: acknowledged once that one is
            state.usage_through = max(state.usage_through, last)
            ack = pb.ControlMessage(usage_ack=pb.UsageAck(through=state.usage_through))
            async with state.writing:
                await context.write(ack.SerializeToString())

    async def _push(self, context: Context, who: agents.AgentIdentity, state: StreamState) -> None:
        while True:
            changed = self._hub.changed(who.region)
            feed = self._hub.feed(who.region, who.node)
            if feed is None:
                raise WrongRegion(f"region {who.region!r} no longer exists")
            if state.sent == 0 and feed.digest(who.node) == state.digest:
                # Same content under an older label (a replica restarted): nothing to send.
                self._reports.applied(who.node_id, state.revision)
                self._reports.desired(who.node_id, state.revision)
                state.sent = state.revision
            elif feed.revision > max(state.sent, state.revision):
                await self._send(context, who, state, feed, whole=False)
            await changed.wait()

    async def _send(
        self,
        context: Context,
        who: agents.AgentIdentity,
        state: StreamState,
        feed: RegionFeed,
        *,
        whole: bool,
    ) -> None:
        """The feed's snapshot for the node: as a delta from what it holds, where it can."""
        tracer = self._hub.tracer
        span = None
        if tracer is not None:
            span = tracer.start_span(f"push revision {feed.revision}",
                                     child_of(feed.trace), SpanKind.PRODUCER)  # fmt: skip
            span.set_attributes({"meridian.region": who.region, "meridian.node": who.node,
                                 "meridian.revision": feed.revision})  # fmt: skip
        try:
            async with state.writing:
                message = None if whole else feed.delta(who.node, state.holds)
                kind = "delta" if message is not None else "full"
                message = message or feed.full(who.node)
                # counted before the write: the agent may have acked it before this resumes
                self._metrics.pushed.labels(kind).inc()
                self._metrics.pushed_bytes.labels(kind).inc(len(message))
                await context.write(message)
        finally:
            if span is not None:
                span.end()
        digest = feed.digest(who.node)
        state.sent, state.sent_digest, state.holds = feed.revision, digest, (feed.revision, digest)
        state.sent_at = time.monotonic()
        self._reports.desired(who.node_id, feed.revision)

    async def _listen(
        self, context: Context, who: agents.AgentIdentity, state: StreamState
    ) -> None:
        while (message := await self._read(context)) is not None:
            body = message.WhichOneof("body")
            if body == "ack":
                self._reports.applied(who.node_id, message.ack.revision)
                self._metrics.acks.labels(who.region).inc()
                if message.ack.revision == state.sent:
                    state.revision, state.digest = state.sent, state.sent_digest
                    if state.sent_at:  # sent on this stream, not found already in force
                        lag = time.monotonic() - state.sent_at
                        self._metrics.push_lag.labels(who.region).observe(lag)
            elif body == "resync":
                log.info(
                    "node %s asked for the whole of revision %s: %s",
                    who.node,
                    message.resync.revision,
                    message.resync.reason,
                    extra={"node_id": who.node, "region": who.region},
                )
                self._metrics.resyncs.labels(who.region).inc()
                feed = self._hub.feed(who.region, who.node)
                if feed is not None:
                    await self._send(context, who, state, feed, whole=True)
            elif body == "nack":
                nack = message.nack
                state.holds = (state.revision, state.digest)  # the next delta is from there
                log.warning(
                    "node %s refused revision %s: %s",
                    who.node,
                    nack.revision,
                    nack.reason,
                    extra={"node_id": who.node, "region": who.region},
                )
                self._reports.nacked(who.node_id, nack.revision, nack.reason or "no reason given")
                self._metrics.nacks.labels(who.region).inc()
            elif body == "heartbeat":
                telemetry = message.heartbeat.telemetry
                at = (
                    telemetry.observed_at.ToDatetime(UTC)
                    if telemetry.HasField("observed_at")
                    else datetime.now(UTC)
                )
                self._reports.heartbeat(who.node_id, telemetry_doc(telemetry), at)
            elif body == "demand" and self._demand is not None:
                self._demand.report(demand_of(who.node, who.region, message.demand))
            elif body == "usage" and self._usage is not None:
                state.usage.put_nowait(message.usage)

    async def _read(self, context: Context) -> pb.AgentMessage | None:
        try:
            async with asyncio.timeout(self._heartbeat_timeout_s):  # wait_for made a task a read
                message = await context.read()
        except TimeoutError:
            raise HeartbeatMissed(
                f"nothing from the agent for {self._heartbeat_timeout_s:g} s; closing its stream"
            ) from None
        if message is grpc.aio.EOF:
            return None
        assert isinstance(message, pb.AgentMessage)
        return message


def demand_of(node: str, region: str, demand: pb.Demand) -> NodeDemand:
    tenants = {t.tenant: TenantDemand.from_message(t) for t in demand.tenants}
    return NodeDemand(node, region, datetime.now(UTC), tenants)
