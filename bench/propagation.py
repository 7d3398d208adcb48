"""From a REST write to the ack of every agent, with N agent streams against one replica.

The control plane runs as its own process (`meridian controlplane serve`) on an embedded
PostgreSQL; the N agents are streams of this process, spread over several gRPC channels.
Each round PATCHes tenant `bench`, which every region's snapshot carries, and times, per
agent, how long after the write began the agent had the new snapshot and had acked it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from meridian_pb.fleet.v1 import fleet_pb2 as pb
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from agents.control.fleet import FleetClient, SyncStream
from bench.plots import write_json
from controlplane.db import migrate
from controlplane.db.embedded import EmbeddedPostgres
from controlplane.db.engine import Database
from meridian.procs import ControlPlane, start_control_plane, stop_child

AGENTS_PER_CHANNEL = 50


@dataclass
class Options:
    agents: int
    regions: int
    rounds: int
    heartbeat_s: float
    out: Path | None
    root: Path  # scratch directory for PostgreSQL's data


def fleet_document(agents: int, regions: int) -> dict[str, Any]:
    names = [f"r{i:03d}" for i in range(regions)]
    return {
        "apiVersion": "meridian/v1",
        "clouds": [{"name": "bench", "provider": "onprem"}],
        "regions": [
            {"name": r, "cloud": "bench", "geography": r, "jurisdiction": "us"} for r in names
        ],
        "nodes": [
            {
                "name": f"n{i:05d}",
                "region": names[i % regions],
                "hostname": f"node-{i}.bench",
                "gpus": [{"index": 0, "model": "H100-SXM-80GB", "memory_gb": 80}],
            }
            for i in range(agents)
        ],
        "models": [{"name": "m", "source": "bench/m", "context_length": 8192}],
        "deployments": [
            {"name": f"m-{r}", "model": "m", "region": r, "backend": "sim", "replicas": 1}
            for r in names
        ],
        "tenants": [{"name": "bench", "requests_per_minute": 1000}],
    }


@dataclass
class SimAgent:
    node: str
    region: str
    credential: str
    stream: SyncStream | None = None
    revision: int = 0
    arrived: dict[int, float] = field(default_factory=dict)  # revision -> perf_counter at ack


class Swarm:
    """N agent streams in this process."""

    def __init__(self, target: str, heartbeat_s: float) -> None:
        self.target = target
        self.heartbeat_s = heartbeat_s
        self.clients: list[FleetClient] = []
        self.agents: list[SimAgent] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.changed = asyncio.Event()

    def client_for(self, index: int) -> FleetClient:
        while len(self.clients) <= index // AGENTS_PER_CHANNEL:
            self.clients.append(FleetClient(self.target))
        return self.clients[index // AGENTS_PER_CHANNEL]

    async def register(
        self, tokens: dict[str, str], nodes: list[dict[str, Any]], progress: Progress
    ) -> None:
        task = progress.add_task("registering agents", total=len(nodes))
        gate = asyncio.Semaphore(32)

        async def one(i: int, node: dict[str, Any]) -> SimAgent:
            async with gate:
                done = await self.client_for(i).register(
                    tokens[node["region"]],
                    region=node["region"],
                    node=node["name"],
                    hostname=node["hostname"],
                )
                progress.advance(task)
                return SimAgent(done.node, done.region, done.credential)

        self.agents = list(await asyncio.gather(*(one(i, n) for i, n in enumerate(nodes))))

    async def connect(self, progress: Progress, batch: int = 250) -> None:
        """Open the streams a batch at a time, each batch waiting for its first snapshots."""
        task = progress.add_task("opening streams, first snapshots", total=len(self.agents))
        for start in range(0, len(self.agents), batch):
            first = []
            for i in range(start, min(start + batch, len(self.agents))):
                agent, arrived = self.agents[i], asyncio.Event()
                agent.stream = self.client_for(i).sync(agent.credential)
                await agent.stream.hello(region=agent.region, node=agent.node)
                listen = self._listen(agent, arrived, progress, task)
                self.tasks.append(asyncio.create_task(listen))
                self.tasks.append(asyncio.create_task(self._beat(agent, i)))
                first.append(arrived)
            for event in first:
                await event.wait()

    async def _listen(
        self, agent: SimAgent, first: asyncio.Event, progress: Progress, task: Any
    ) -> None:
        assert agent.stream is not None
        while (snapshot := await agent.stream.next_snapshot()) is not None:
            await agent.stream.ack(snapshot.revision)
            agent.arrived[snapshot.revision] = time.perf_counter()
            agent.revision = snapshot.revision
            if not first.is_set():
                first.set()
                progress.advance(task)
            self.changed.set()

    async def _beat(self, agent: SimAgent, index: int) -> None:
        assert agent.stream is not None
        await asyncio.sleep(self.heartbeat_s * index / max(1, len(self.agents)))  # spread out
        while True:
            telemetry = pb.Telemetry(inflight_requests=index % 7, queued_requests=index % 3)
            telemetry.observed_at.GetCurrentTime()
            await agent.stream.heartbeat(telemetry)
            await asyncio.sleep(self.heartbeat_s)

    async def all_at(self, revision: int, timeout_s: float) -> None:
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

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for client in self.clients:
            await client.close()


def rss_mb(pid: int) -> tuple[float, float]:
    """(current, peak) resident memory of a process, from /proc."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def _start_control_plane(db_url: str, token: str, console: Console) -> ControlPlane:
    env = {
        "MERIDIAN_DATABASE_URL": db_url,
        "MERIDIAN_ADMIN_TOKEN": token,
        "MERIDIAN_LOG_LEVEL": os.environ.get("MERIDIAN_LOG_LEVEL", "warning"),
    }
    cp = await start_control_plane(env)
    console.print(
        f"[green]✓[/] control plane (pid {cp.process.pid}) on {cp.url}, gRPC {cp.grpc_target}"
    )
    return cp


async def _measure(options: Options, http: httpx.AsyncClient, swarm: Swarm) -> list[float]:
    samples: list[float] = []
    for round_ in range(options.rounds):
        started = time.perf_counter()
        response = await http.patch(
            "/v1/tenants/bench",
            json={"requests_per_minute": 1000 * (round_ + 2)},  # every share moves
            headers={"If-Match": "*"},
        )
        response.raise_for_status()
        revision = int(response.headers.get("X-Meridian-Revision") or 0) or int(
            (await http.get("/v1/revision")).json()["revision"]
        )
        await swarm.all_at(revision, timeout_s=120)
        samples.extend(a.arrived[revision] - started for a in swarm.agents)
        await asyncio.sleep(0.5)
    return samples


async def run(options: Options) -> dict[str, Any]:
    console = Console()
    token = secrets.token_urlsafe(24)
    root = options.root
    postgres = EmbeddedPostgres(root / "postgres")
    credentials = await postgres.start()
    db_url = credentials.url("postgres")
    proc = None
    swarm: Swarm | None = None
    try:
        db = Database.connect(db_url, pool_size=1)
        await migrate.upgrade(db.engine)
        await db.close()
        console.print(f"[green]✓[/] PostgreSQL (embedded, {root})")
        cp = await _start_control_plane(db_url, token, console)
        proc, url, target = cp.process, cp.url, cp.grpc_target
        doc = fleet_document(options.agents, options.regions)
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
            applied = await http.post(
                "/v1/apply",
                content=yaml.safe_dump(doc).encode(),
                headers={"Content-Type": "application/yaml"},
            )
            applied.raise_for_status()
            tokens = {}
            for region in doc["regions"]:
                made = await http.post("/v1/bootstrap-tokens", json={"region": region["name"]})
                made.raise_for_status()
                tokens[region["name"]] = made.json()["token"]
            swarm = Swarm(target, options.heartbeat_s)
            with Progress(console=console, transient=True) as progress:
                started = time.perf_counter()
                await swarm.register(tokens, doc["nodes"], progress)
                registered_s = time.perf_counter() - started
                started = time.perf_counter()
                await swarm.connect(progress)
                connected_s = time.perf_counter() - started
            console.print(
                f"[green]✓[/] {options.agents} agents registered in {registered_s:.1f} s, "
                f"connected with their first snapshot in {connected_s:.1f} s"
            )
            with console.status(f"{options.rounds} rounds of write → every ack"):
                samples = await _measure(options, http, swarm)
        rss, peak = rss_mb(proc.pid)
    finally:
        if swarm is not None:
            await swarm.close()
        if proc is not None:
            await stop_child(proc)
        await postgres.stop()
    result = {
        "agents": options.agents,
        "p50_s": round(percentile(samples, 0.50), 4),
        "p99_s": round(percentile(samples, 0.99), 4),
        "cp_rss_mb": round(peak, 1),
        "max_s": round(max(samples), 4),
        "cp_rss_now_mb": round(rss, 1),
        "regions": options.regions,
        "rounds": options.rounds,
        "samples": len(samples),
        "heartbeat_s": options.heartbeat_s,
        "register_s": round(registered_s, 2),
        "connect_s": round(connected_s, 2),
    }
    _report(console, result)
    write_json(console, result, options.out)
    return result


def _report(console: Console, result: dict[str, Any]) -> None:
    table = Table(title="write → ack of every agent (one control-plane replica)")
    for column in ("agents", "regions", "samples", "p50 s", "p99 s", "max s", "CP peak RSS MB"):
        table.add_column(column, justify="right")
    table.add_row(
        str(result["agents"]),
        str(result["regions"]),
        str(result["samples"]),
        f"{result['p50_s']:.3f}",
        f"{result['p99_s']:.3f}",
        f"{result['max_s']:.3f}",
        f"{result['cp_rss_mb']:.0f}",
    )
    console.print(table)
