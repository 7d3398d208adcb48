"""Agents for the tests: a real Fleet client, with its snapshots read into a queue."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents.control.fleet import ChannelTls, FleetClient, SyncStream
from tests.kits.controlplane import ADMIN_TOKEN, Server
from tests.kits.fleet_docs import example

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def seed(url: str) -> int:
    """Apply examples/fleet.yaml; the revision it made."""
    async with httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=30) as http:
        response = await http.post("/v1/apply", json=example())
        assert response.status_code == 200, response.text
        return int(response.json()["revision"])


async def bootstrap_token(url: str, region: str) -> str:
    async with httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=30) as http:
        response = await http.post("/v1/bootstrap-tokens", json={"region": region})
        assert response.status_code == 201, response.text
        return str(response.json()["token"])


async def get(url: str, path: str) -> Any:
    async with httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=30) as http:
        response = await http.get(path)
        assert response.status_code == 200, response.text
        return response.json()


async def patch(url: str, path: str, body: dict[str, Any]) -> Any:
    async with httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=30) as http:
        response = await http.patch(path, json=body, headers={"If-Match": "*"})
        assert response.status_code == 200, response.text
        return response.json()


async def admin(url: str, method: str, path: str, body: Any = None) -> Any:
    """One admin API call as the admin (`If-Match: *` on writes): its JSON, if any."""
    headers = {**ADMIN, "If-Match": "*"} if method in ("PATCH", "PUT", "DELETE") else ADMIN
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        response = await http.request(method, path, json=body)
        assert response.status_code < 300, response.text
        return response.json() if response.content else None


async def eventually(probe: Any, *, within_s: float = 10.0, every_s: float = 0.2) -> Any:
    """Poll `probe()` until it returns something truthy; fail after `within_s`."""
    async with asyncio.timeout(within_s):
        # Another process changes what we poll, so there is no Event to wait on.
        while not (value := await probe()):  # noqa: ASYNC110
            await asyncio.sleep(every_s)
    return value


EXAMPLE_HOSTS = {"us-east": "127.0.0.1", "us-west": "127.0.0.2", "eu-west": "127.0.0.3"}


@dataclass
class Agent:
    """One registered agent and, once connected, its stream."""

    target: str
    region: str
    credential: str = ""
    node: str = ""
    tls: ChannelTls | None = None
    revision: int = 0
    digest: str = ""
    held: pb.Snapshot | None = None  # the snapshot applied last: deltas apply to it
    snapshots: asyncio.Queue[pb.Snapshot | BaseException | None] = field(
        default_factory=asyncio.Queue
    )
    _client: FleetClient | None = None
    _stream: SyncStream | None = None
    _reader: asyncio.Task[None] | None = None
    _beats: asyncio.Task[None] | None = None
    heartbeat_every_s: float = 0.5  # as a live agent does; `silence()` stops it
    telemetry: pb.Telemetry = field(default_factory=pb.Telemetry)  # what the heartbeats say

    @property
    def client(self) -> FleetClient:
        if self._client is None:
            self._client = FleetClient(self.target, tls=self.tls)
        return self._client

    async def register(self, token: str, hostname: str | None = None, node: str = "") -> None:
        """By default from the host of the region's node in examples/fleet.yaml: claims it."""
        host = hostname or EXAMPLE_HOSTS.get(self.region, "127.0.0.1")
        done = await self.client.register(token, region=self.region, hostname=host, node=node)
        self.credential, self.node = done.credential, done.node

    async def connect(self, target: str | None = None, *, region: str | None = None) -> None:
        """Open a stream (to `target` if given) and say the revision this agent runs."""
        await self.disconnect()
        if target is not None and target != self.target:
            if self._client is not None:
                await self._client.close()
            self.target, self._client = target, None
        self.snapshots = asyncio.Queue()
        self._stream = self.client.sync(self.credential)
        # A stream refused at its start (bad credential) may end before the Hello is written:
        # the reader below then takes the error, for `ended()` to give.
        with contextlib.suppress(grpc.aio.AioRpcError):
            held = (
                self.held if self.held is not None and self.held.revision == self.revision else None
            )
            await self._stream.hello(
                region=region or self.region,
                node=self.node,
                revision=self.revision,
                digest=self.digest,
                held=held,
            )
        self._reader = asyncio.create_task(self._read(self._stream))
        self._beats = asyncio.create_task(self._beat(self._stream))

    async def _beat(self, stream: SyncStream) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            while True:
                await asyncio.sleep(self.heartbeat_every_s)
                telemetry = pb.Telemetry()
                telemetry.CopyFrom(self.telemetry)
                telemetry.observed_at.GetCurrentTime()
                await stream.heartbeat(telemetry)

    async def silence(self) -> None:
        """Stop the periodic heartbeats, as a hung agent would."""
        await _cancel(self._beats)
        self._beats = None

    async def _read(self, stream: SyncStream) -> None:
        try:
            while (snapshot := await stream.next_snapshot()) is not None:
                await self.snapshots.put(snapshot)
            await self.snapshots.put(None)
        except (grpc.aio.AioRpcError, asyncio.CancelledError) as exc:
            await self.snapshots.put(exc)

    async def next(self, within_s: float = 10.0) -> pb.Snapshot:
        item = await asyncio.wait_for(self.snapshots.get(), within_s)
        if not isinstance(item, pb.Snapshot):
            raise AssertionError(f"expected a snapshot, the stream gave {item!r}")
        return item

    async def ended(self, within_s: float = 10.0) -> BaseException | None:
        """Wait for the stream to end; the error it ended with."""
        async with asyncio.timeout(within_s):
            while isinstance(item := await self.snapshots.get(), pb.Snapshot):
                pass
        return item

    async def nothing(self, for_s: float = 1.5) -> None:
        with contextlib.suppress(TimeoutError):
            item = await asyncio.wait_for(self.snapshots.get(), for_s)
            raise AssertionError(f"expected nothing, got {item!r}")

    async def apply(self, snapshot: pb.Snapshot) -> None:
        """Take a snapshot as good: ack it and remember it, as an agent does."""
        assert self._stream is not None
        await self._stream.ack(snapshot.revision)
        self.revision, self.digest, self.held = snapshot.revision, snapshot.digest, snapshot

    async def refuse(self, snapshot: pb.Snapshot, reason: str) -> None:
        assert self._stream is not None
        await self._stream.nack(snapshot.revision, reason)

    @property
    def stream(self) -> SyncStream:
        assert self._stream is not None
        return self._stream

    async def heartbeat(self, telemetry: pb.Telemetry) -> None:
        assert self._stream is not None
        await self._stream.heartbeat(telemetry)

    async def disconnect(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        await _cancel(self._beats)
        await _cancel(self._reader)
        self._reader = self._beats = None

    async def close(self) -> None:
        await self.disconnect()
        if self._client is not None:
            await self._client.close()
            self._client = None


async def _cancel(task: asyncio.Task[None] | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def registered(server: Server, region: str, node: str = "") -> Agent:
    agent = Agent(server.grpc_target, region)
    await agent.register(await bootstrap_token(server.url, region), node=node)
    return agent
