"""A client of the control plane's Fleet service, over one gRPC channel.

client = FleetClient("cp.example:8401", tls=ChannelTls(ca=...))
done = await client.register(token, region="us-east", hostname="gpu-1")
stream = client.sync(done.credential)
await stream.hello(region="us-east", revision=0)
snapshot = await stream.next_snapshot()
await stream.ack(snapshot.revision)
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc
from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1 import fleet_pb2_grpc as pb_grpc
from meridian_pb.fleet.v1.content import digest
from meridian_pb.fleet.v1.delta import apply as delta_apply

CHANNEL_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


@dataclass(frozen=True)
class ChannelTls:
    """The CA that signed the control plane's certificate; a client pair for mutual TLS."""

    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str | None = None  # when the certificate's name is not the host dialled

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_file.read_bytes(),
            private_key=self.key_file.read_bytes() if self.key_file else None,
            certificate_chain=self.cert_file.read_bytes() if self.cert_file else None,
        )


def spread(target: str, key: str) -> str:
    """The target with its list of addresses (`ipv4:a:8401,b:8401`) turned to start at one
    picked by `key` (the node): gRPC's pick_first holds the stream to the first that answers
    and moves down the list when it dies, so agents spread over the replicas, each always
    starting at the same one, and no one replica's loop sends a write to all of them.
    (pick_first's own `shuffleAddressList` did not shuffle in the grpcio this runs on.)"""
    scheme, sep, rest = target.partition(":")
    addresses = rest.split(",")
    if scheme not in ("ipv4", "ipv6") or not sep or len(addresses) < 2:
        return target
    start = zlib.crc32(key.encode()) % len(addresses)
    return f"{scheme}:{','.join(addresses[start:] + addresses[:start])}"


def error_code(error: grpc.aio.AioRpcError) -> str | None:
    """The control plane's stable error code of a failed call."""
    for key, value in error.trailing_metadata() or ():
        if key == "meridian-code":
            return str(value)
    return None


class FleetClient:
    def __init__(self, target: str, *, tls: ChannelTls | None = None) -> None:
        options = list(CHANNEL_OPTIONS)
        if tls is None:
            self.channel = grpc.aio.insecure_channel(target, options=options)
        else:
            if tls.server_name:
                options.append(("grpc.ssl_target_name_override", tls.server_name))
            self.channel = grpc.aio.secure_channel(target, tls.credentials(), options=options)
        self._stub = pb_grpc.FleetStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()

    async def register(
        self,
        token: str,
        *,
        region: str,
        hostname: str,
        node: str = "",
        gpus: Iterable[pb.Gpu] = (),
        agent_version: str = "",
        timeout_s: float = 10.0,
    ) -> pb.RegisterResponse:
        request = pb.RegisterRequest(
            bootstrap_token=token,
            region=region,
            node=node,
            hostname=hostname,
            gpus=list(gpus),
            agent_version=agent_version,
        )
        response: pb.RegisterResponse = await self._stub.Register(request, timeout=timeout_s)
        return response

    def sync(self, credential: str) -> SyncStream:
        call = self._stub.Sync(metadata=(("authorization", f"Bearer {credential}"),))
        return SyncStream(call)


class SyncStream:
    """One Sync stream: write Hello, acks, nacks and heartbeats; read snapshots.

    gRPC allows one write in flight per call, and acks and heartbeats come from different
    tasks, so writes take turns.

    A delta is made into the snapshot it stands for here, from the last snapshot read (or,
    after a nack, the last acked), as the control plane assumes; one whose result does not
    have the digest it announced is answered with a Resync, and the whole snapshot follows.
    """

    def __init__(self, call: grpc.aio.StreamStreamCall[pb.AgentMessage, pb.ControlMessage]):
        self.call = call
        self._writing = asyncio.Lock()
        self.held: pb.Snapshot | None = None  # the last snapshot acked (or said in Hello)
        self._base: pb.Snapshot | None = None  # what the next delta applies to
        self.resyncs = 0

    async def _write(self, message: pb.AgentMessage) -> None:
        async with self._writing:
            await self.call.write(message)

    async def hello(
        self,
        *,
        region: str,
        node: str = "",
        revision: int = 0,
        digest: str = "",
        held: pb.Snapshot | None = None,
    ) -> None:
        """Say what the agent runs: `held`, or its revision and digest alone."""
        if held is not None:
            revision, digest = held.revision, held.digest
            self.held = self._base = held
        hello = pb.Hello(region=region, node=node, revision=revision, digest=digest)
        await self._write(pb.AgentMessage(hello=hello))

    async def ack(self, revision: int) -> None:
        if self._base is not None and self._base.revision == revision:
            self.held = self._base
        await self._write(pb.AgentMessage(ack=pb.Ack(revision=revision)))

    async def nack(self, revision: int, reason: str) -> None:
        self._base = self.held
        await self._write(pb.AgentMessage(nack=pb.Nack(revision=revision, reason=reason)))

    async def resync(self, revision: int, reason: str) -> None:
        self.resyncs += 1
        await self._write(pb.AgentMessage(resync=pb.Resync(revision=revision, reason=reason)))

    async def heartbeat(self, telemetry: pb.Telemetry) -> None:
        await self._write(pb.AgentMessage(heartbeat=pb.Heartbeat(telemetry=telemetry)))

    async def demand(self, demand: pb.Demand) -> None:
        await self._write(pb.AgentMessage(demand=demand))

    async def usage(self, records: list[pb.UsageRecord]) -> None:
        await self._write(pb.AgentMessage(usage=pb.UsageBatch(records=records)))

    async def next_message(self) -> pb.ControlMessage | None:
        """The next message, or None when the control plane ended the stream cleanly."""
        message = await self.call.read()
        if message is grpc.aio.EOF:
            return None
        assert isinstance(message, pb.ControlMessage)
        return message

    async def next_snapshot(self) -> pb.Snapshot | None:
        """The next snapshot (past any other message), or None at the stream's clean end."""
        while (message := await self.next_message()) is not None:
            snapshot = await self.snapshot_of(message)
            if snapshot is not None:
                return snapshot
        return None

    async def snapshot_of(self, message: pb.ControlMessage) -> pb.Snapshot | None:
        """The snapshot a message brings, whole or as a delta; None for any other message,
        and for a delta that could not be applied (a Resync is sent for it)."""
        body = message.WhichOneof("body")
        if body == "snapshot":
            self._base = message.snapshot
            return message.snapshot
        if body != "delta":
            return None
        delta = message.delta
        made = delta_apply(self._base, delta) if self._base is not None else None
        if made is None:
            await self.resync(delta.revision, "the delta is not from the revision held")
            return None
        if digest(made) != delta.digest:
            await self.resync(delta.revision, "the delta's result differs from its digest")
            return None
        self._base = made
        return made

    def close(self) -> None:
        self.call.cancel()
