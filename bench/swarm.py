"""Simulated agents for the propagation benchmark, in processes of their own.

The control plane's cost is what the benchmark measures, so the agents' side must not share
its event loop or its process: each `SwarmProcess` is a child process holding its share of
the agent streams, driven over a pipe. Each agent is the real client (agents/control/fleet.py):
it makes deltas into snapshots and checks their digest, acks every snapshot, and beats.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents.control.fleet import FleetClient, SyncStream

AGENTS_PER_CHANNEL = 50
CONNECT_BATCH = 250


@dataclass
class SimAgent:
    node: str
    region: str
    target: str
    credential: str = ""
    stream: SyncStream | None = None
    revision: int = 0
    acked_at: dict[int, float] = field(default_factory=dict)  # revision -> time.monotonic()


class Swarm:
    """The agents of one process (the child's side)."""

    def __init__(self, heartbeat_s: float, report: Any) -> None:
        self.heartbeat_s = heartbeat_s
        self.report = report  # (kind, value) -> None: progress to the parent
        self.clients: dict[tuple[str, int], FleetClient] = {}
        self.agents: list[SimAgent] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.changed = asyncio.Event()
        self.resyncs = 0

    def client(self, index: int, target: str) -> FleetClient:
        key = (target, index // AGENTS_PER_CHANNEL)
        if key not in self.clients:
            self.clients[key] = FleetClient(target)
        return self.clients[key]

    async def register(self, tokens: dict[str, str], nodes: list[dict[str, Any]]) -> None:
        gate = asyncio.Semaphore(16)

        async def one(i: int, node: dict[str, Any]) -> SimAgent:
            async with gate:
                agent = SimAgent(node["name"], node["region"], node["target"])
                done = await self.client(i, agent.target).register(
                    tokens[agent.region],
                    region=agent.region,
                    node=agent.node,
                    hostname=node["hostname"],
                )
                agent.credential = done.credential
                self.report("progress", 1)
                return agent

        self.agents = list(await asyncio.gather(*(one(i, n) for i, n in enumerate(nodes))))

    async def connect(self) -> None:
        """Open the streams a batch at a time, each batch waiting for its first snapshots."""
        for start in range(0, len(self.agents), CONNECT_BATCH):
            first = []
            for i in range(start, min(start + CONNECT_BATCH, len(self.agents))):
                agent, arrived = self.agents[i], asyncio.Event()
                agent.stream = self.client(i, agent.target).sync(agent.credential)
                await agent.stream.hello(region=agent.region, node=agent.node)
                self.tasks.append(asyncio.create_task(self._listen(agent, arrived)))
                self.tasks.append(asyncio.create_task(self._beat(agent, i)))
                first.append(arrived)
            for event in first:
                await event.wait()
            self.report("progress", len(first))

    async def _listen(self, agent: SimAgent, first: asyncio.Event) -> None:
        assert agent.stream is not None
        while (snapshot := await agent.stream.next_snapshot()) is not None:
            await agent.stream.ack(snapshot.revision)
            agent.acked_at[snapshot.revision] = time.monotonic()
            agent.revision = snapshot.revision
            first.set()
            self.changed.set()

    async def _beat(self, agent: SimAgent, index: int) -> None:
        assert agent.stream is not None
        await asyncio.sleep(self.heartbeat_s * index / max(1, len(self.agents)))  # spread out
        while True:
            telemetry = pb.Telemetry(inflight_requests=index % 7, queued_requests=index % 3)
            telemetry.observed_at.GetCurrentTime()
            await agent.stream.heartbeat(telemetry)
            await asyncio.sleep(self.heartbeat_s)

    async def acked(self, revision: int, timeout_s: float) -> list[float]:
        """When each agent acked `revision` (or a newer one), once all have."""
        try:
            async with asyncio.timeout(timeout_s):
                while any(a.revision < revision for a in self.agents):
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            behind = sorted({a.revision for a in self.agents if a.revision < revision})
            ended = [t for t in self.tasks if t.done()]
            why = {repr(t.exception())[:200] for t in ended if not t.cancelled()}
            raise TimeoutError(
                f"after {timeout_s:g} s, agents still at revisions {behind}, not {revision}; "
                f"{len(ended)} streams ended: {why}"
            ) from None
        return [min(t for r, t in a.acked_at.items() if r >= revision) for a in self.agents]

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for client in self.clients.values():
            await client.close()


def _child(conn: Connection, heartbeat_s: float, cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    asyncio.run(_serve(conn, heartbeat_s))


async def _serve(conn: Connection, heartbeat_s: float) -> None:
    loop = asyncio.get_running_loop()
    swarm = Swarm(heartbeat_s, lambda kind, value: conn.send((kind, value)))
    while True:
        command, args = await loop.run_in_executor(None, conn.recv)
        try:
            if command == "register":
                await swarm.register(*args)
                result: Any = len(swarm.agents)
            elif command == "connect":
                await swarm.connect()
                result = len(swarm.agents)
            elif command == "acked":
                result = await swarm.acked(*args)
            elif command == "cpu":
                result = time.process_time()
            elif command == "resyncs":
                result = sum(a.stream.resyncs for a in swarm.agents if a.stream is not None)
            else:
                await swarm.close()
                conn.send(("done", None))
                return
        except Exception as error:  # reported to the parent, which raises it
            conn.send(("error", f"{type(error).__name__}: {error}"))
            continue
        conn.send(("done", result))


class SwarmProcess:
    """The parent's handle on one child of agents."""

    def __init__(self, heartbeat_s: float, cpu: int | None = None) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self.process = context.Process(target=_child, args=(child, heartbeat_s, cpu), daemon=True)
        self.process.start()
        self._lock = asyncio.Lock()

    async def call(self, command: str, *args: Any, progress: Any = None) -> Any:
        """Run a command in the child; `progress(n)` for each piece of progress it reports."""
        loop = asyncio.get_running_loop()
        async with self._lock:
            await loop.run_in_executor(None, self._conn.send, (command, args))
            while True:
                kind, value = await loop.run_in_executor(None, self._conn.recv)
                if kind == "progress":
                    if progress is not None:
                        progress(value)
                elif kind == "error":
                    raise RuntimeError(f"agents' process: {value}")
                else:
                    return value

    async def close(self) -> None:
        if self.process.is_alive():
            try:
                await asyncio.wait_for(self.call("close"), 30)
            except (TimeoutError, EOFError, BrokenPipeError, RuntimeError):
                self.process.kill()
        await asyncio.get_running_loop().run_in_executor(None, self.process.join, 10)
