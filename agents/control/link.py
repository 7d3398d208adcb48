"""The agent's side of the Fleet stream: register, say what it has, apply, ack or nack, beat.

It never gives up: every failure (control plane down, stream cut, credential refused) ends
in a jittered, growing pause and another try, while the engines go on as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.framing import STREAM_ACCEPTED

from agents.control.fleet import ChannelTls, FleetClient, SyncStream, error_code, spread
from agents.control.store import Identity, Store
from agents.engines.gpus import Gpu
from agents.errors import RegistrationFailed, SnapshotInvalid
from agents.ledger.journal import Journal
from agents.settings import AgentSettings

log = logging.getLogger(__name__)
AGENT_VERSION = "meridian-agent/0.4"
FORGET_CREDENTIAL = {"agent_credential_invalid"}
MIN_BEAT_S = 0.1
TOKEN_COMMAND_TIMEOUT_S = 60.0


@dataclass
class LinkState:
    connected: bool = False
    reached: bool = False  # the control plane has answered at least once since start
    last_error: str = ""
    node: str = ""


Apply = Callable[[pb.Snapshot], Awaitable[None]]  # raises SnapshotInvalid
DEMAND_EVERY_S = 1.0  # the leader splits quotas by these reports: see agents/gateway/demand.py
SHIP_EVERY_S = 0.5  # the usage journal is read this often, unless a whole batch waits
SHIP_BATCH = 500  # records a message
SHIP_WINDOW = 4 * SHIP_BATCH  # records sent and not yet acknowledged, at most
SHIP_AGAIN_S = 10.0  # sent, and no acknowledgement since: sent again (stored once)


@dataclass(frozen=True)
class QuotaHooks:
    """The gateway's side of the global quotas: what it takes, and what it reports."""

    leases: Callable[[pb.Leases], None]
    demand: Callable[[], pb.Demand]


class ControlLink:
    def __init__(
        self,
        settings: AgentSettings,
        store: Store,
        *,
        current: Callable[[], pb.Snapshot | None],
        apply: Apply,
        telemetry: Callable[[], Awaitable[pb.Telemetry]],
        gpus: list[Gpu] | None,
        quotas: QuotaHooks | None = None,
    ) -> None:
        self.settings, self.store = settings, store
        self._current, self._apply, self._telemetry = current, apply, telemetry
        self._quotas = quotas
        self.journal: Journal | None = None  # the usage ledger's, shipped while connected
        self._acked = asyncio.Event()
        self._gpus = gpus or []
        self.state = LinkState()
        self._soon = asyncio.Event()
        identity = store.load_identity()
        self.state.node = settings.node or (identity.node if identity else "")

    def tls(self) -> ChannelTls | None:
        s = self.settings
        if s.tls_ca_file is None:
            return None
        return ChannelTls(s.tls_ca_file, s.tls_cert_file, s.tls_key_file, s.tls_server_name)

    async def run(self) -> None:
        backoff = self.settings.reconnect_min_s
        while True:
            key = self.state.node or self.settings.hostname
            client = FleetClient(spread(self.settings.control_plane, key), tls=self.tls())
            try:
                identity = await self._identity(client)
                await self._session(client, identity)
                self.state.last_error = ""
            except grpc.aio.AioRpcError as error:
                code = error_code(error)
                self.state.last_error = f"{error.code().name}: {error.details()}"
                if code in FORGET_CREDENTIAL:
                    await asyncio.to_thread(self._forget_credential)
            except (RegistrationFailed, OSError) as error:
                self.state.last_error = str(error)
            finally:
                await client.close()
            if self.state.connected:
                backoff = self.settings.reconnect_min_s  # it worked once: start small again
            self.state.connected = False
            if self.state.last_error:
                log.warning("control plane: %s", self.state.last_error)
            await asyncio.sleep(backoff / 2 + random.uniform(0, backoff / 2))
            backoff = min(self.settings.reconnect_max_s, backoff * 2)

    async def _identity(self, client: FleetClient) -> Identity:
        identity = await asyncio.to_thread(self.store.load_identity)
        if identity is not None and identity.credential and identity.region == self.settings.region:
            self.state.node = identity.node
            return identity
        answer = await client.register(
            await self._bootstrap_token(),
            region=self.settings.region,
            hostname=self.settings.hostname,
            node=self.state.node,
            gpus=[pb.Gpu(index=g.index, model=g.model, memory_gb=g.memory_gb) for g in self._gpus],
            agent_version=AGENT_VERSION,
        )
        identity = Identity(answer.agent_id, answer.region, answer.node, answer.credential)
        await asyncio.to_thread(self.store.save_identity, identity)
        self.state.node = identity.node
        log.info("registered as node %s of region %s", identity.node, identity.region)
        return identity

    async def _bootstrap_token(self) -> str:
        """The token given, or what the token command prints now: a pool's machines may boot
        before the operator has put a token in the secret store, or after it was rotated."""
        given, command = self.settings.bootstrap_token, self.settings.bootstrap_token_command
        if given is not None:
            return given.get_secret_value()
        if command is None:
            raise RegistrationFailed("no credential on disk and no bootstrap token to get one")
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), TOKEN_COMMAND_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RegistrationFailed(
                f"the bootstrap token command ran past {TOKEN_COMMAND_TIMEOUT_S:.0f} s"
            ) from None
        token = out.decode(errors="replace").strip()
        if proc.returncode != 0:
            said = err.decode(errors="replace").strip().splitlines()
            why = said[-1][:300] if said else "and said nothing"
            raise RegistrationFailed(f"the bootstrap token command exited {proc.returncode}: {why}")
        if not token:
            raise RegistrationFailed(
                "the bootstrap token command printed no token: has `meridian join` put one in "
                "the secret store yet?"
            )
        return token

    def _forget_credential(self) -> None:
        identity = self.store.load_identity()
        if identity is not None:
            self.store.save_identity(
                Identity(identity.agent_id, identity.region, identity.node, "")
            )

    async def _session(self, client: FleetClient, identity: Identity) -> None:
        stream = client.sync(identity.credential)
        beats: asyncio.Task[None] | None = None
        reports: asyncio.Task[None] | None = None
        shipping: asyncio.Task[None] | None = None
        try:
            await stream.hello(
                region=self.settings.region, node=identity.node, held=self._current()
            )
            metadata = await stream.call.initial_metadata()
            if metadata is None or STREAM_ACCEPTED not in dict(metadata):
                await stream.call.wait_for_connection()
                await stream.next_snapshot()  # raises the refusal's status
                return
            self.state.connected = self.state.reached = True
            self.state.last_error = ""
            log.info("connected to the control plane at %s", self.settings.control_plane)
            loop = asyncio.get_running_loop()
            beats = loop.create_task(self._beat(stream))
            if self._quotas is not None:
                reports = loop.create_task(self._report(stream, self._quotas))
            if self.journal is not None:
                shipping = loop.create_task(self._ship(stream, self.journal))
            while (message := await stream.next_message()) is not None:
                snapshot = await stream.snapshot_of(message)  # whole, or made from a delta
                body = message.WhichOneof("body")
                if snapshot is not None:
                    await self._take(stream, snapshot)
                elif body == "leases" and self._quotas is not None:
                    self._quotas.leases(message.leases)
                elif body == "usage_ack" and self.journal is not None:
                    self.journal.ack(message.usage_ack.through)
                    self._acked.set()
        finally:
            for task in (beats, reports, shipping):
                if task is not None:
                    task.cancel()
            stream.close()

    async def _take(self, stream: SyncStream, snapshot: pb.Snapshot) -> None:
        try:
            await self._apply(snapshot)
        except SnapshotInvalid as refused:
            log.warning("refused revision %s: %s", snapshot.revision, refused.message)
            await stream.nack(snapshot.revision, refused.message)
            return
        await stream.ack(snapshot.revision)

    def beat_soon(self) -> None:
        """Send the next heartbeat now, not at its time: something the fleet should see changed
        (an engine's state)."""
        self._soon.set()

    async def _report(self, stream: SyncStream, quotas: QuotaHooks) -> None:
        """The tenants' demand every second while any has some, and once when none has (the
        first report, even empty, tells the control plane this agent takes leases)."""
        said = True
        try:
            while True:
                demand = quotas.demand()
                if demand.tenants or said:
                    await stream.demand(demand)
                said = bool(demand.tenants)
                await asyncio.sleep(DEMAND_EVERY_S)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as error:
            log.debug("demand reports stop with the stream: %s", error)

    async def _ship(self, stream: SyncStream, journal: Journal) -> None:
        """The journal's records the control plane has not acknowledged, oldest first, in
        batches, at most SHIP_WINDOW ahead of its acknowledgements; on each new stream, from
        the last acknowledged (what was sent on the one before may not have been stored)."""
        sent = journal.acked
        loop = asyncio.get_running_loop()
        acked, progress = sent, loop.time()
        try:
            while True:
                self._acked.clear()
                if journal.acked != acked or sent == journal.acked:
                    acked, progress = journal.acked, loop.time()
                elif loop.time() - progress > SHIP_AGAIN_S:  # not stored: the control
                    sent, progress = journal.acked, loop.time()  # plane's database was away
                if sent - journal.acked >= SHIP_WINDOW:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._acked.wait(), SHIP_EVERY_S * 5)
                    continue
                records = await asyncio.to_thread(journal.records_after, sent, SHIP_BATCH)
                if records:
                    await stream.usage(records)
                    sent = records[-1].seq
                if len(records) < SHIP_BATCH:  # all there was: a message a while, not a record
                    await asyncio.sleep(SHIP_EVERY_S)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as error:
            log.debug("usage records stop with the stream: %s", error)

    async def _beat(self, stream: SyncStream) -> None:
        try:
            while True:
                self._soon.clear()
                await stream.heartbeat(await self._telemetry())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._soon.wait(), self.settings.heartbeat_s)
                await asyncio.sleep(MIN_BEAT_S)  # a burst of changes makes one beat
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as error:
            log.debug("heartbeats stop with the stream: %s", error)
