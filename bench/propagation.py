"""From a REST write to the ack of every agent, with what each agent costs the control plane.

PostgreSQL (embedded), etcd when there are several replicas, the control-plane replicas
(`meridian controlplane serve`) and the simulated agents all run as processes of their own.
The agents (bench/swarm.py) are spread over `--agent-processes` children and, round robin,
over the replicas. Each round PATCHes tenant `bench`, which every region's snapshot
carries, and times, per agent, how long after the write began the agent had the new
snapshot and had acked it. Around the rounds it reads, from /proc and the replicas'
metrics: the replicas' CPU time (and, from an idle window, how much of it the heartbeats
take anyway), the bytes they sent, the time their compiles spent reading PostgreSQL,
PostgreSQL's own CPU time, their peak memory, and the agents' CPU time, apart.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench import stream_floor
from bench.plots import write_json
from bench.procfs import cpu_seconds, rss_mb
from bench.swarm import SwarmProcess
from controlplane.db import migrate
from controlplane.db.embedded import EmbeddedPostgres, server_pid
from controlplane.db.engine import Database
from meridian.procs import ControlPlane, running_etcd, start_control_plane, stop_child

IDLE_S = 5.0  # the window in which only heartbeats load the control plane


@dataclass
class Options:
    agents: list[int]
    regions: int
    rounds: int
    heartbeat_s: float
    replicas: int
    agent_processes: int
    out: Path | None
    root: Path  # scratch directory for PostgreSQL's and etcd's data


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
        # a tenant's quota is a fact, not intent: it reaches every node at once anyway
        "rollout_policies": [{"name": "default", "strategy": "immediate"}],
    }


def tree_cpu_s(root: int) -> float:
    """The CPU time of a server and its live children (PostgreSQL's backends)."""
    total = cpu_seconds(root)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
                if f"\nPPid:\t{root}\n" in status:
                    total += cpu_seconds(int(entry.name), children=False)
            except (FileNotFoundError, ProcessLookupError):
                continue
    return total


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass
class Gauges:
    """What is read around a window: CPU times and the replicas' counters."""

    at: float
    replicas_cpu: float
    postgres_cpu: float
    agents_cpu: float
    sent_bytes: float
    sent: dict[str, float]
    read_s: float
    compile_s: float

    def minus(self, before: Gauges) -> dict[str, float]:
        return {
            "seconds": self.at - before.at,
            "replicas_cpu": self.replicas_cpu - before.replicas_cpu,
            "postgres_cpu": self.postgres_cpu - before.postgres_cpu,
            "agents_cpu": self.agents_cpu - before.agents_cpu,
            "sent_bytes": self.sent_bytes - before.sent_bytes,
            "full": self.sent.get("full", 0) - before.sent.get("full", 0),
            "delta": self.sent.get("delta", 0) - before.sent.get("delta", 0),
            "read_s": self.read_s - before.read_s,
            "compile_s": self.compile_s - before.compile_s,
        }


class Run:
    """One measured run at one number of agents."""

    def __init__(self, options: Options, agents: int, console: Console) -> None:
        self.options, self.agents, self.console = options, agents, console
        self.replicas: list[ControlPlane] = []
        self.swarms: list[SwarmProcess] = []
        self.postgres_pid = 0
        self.token = secrets.token_urlsafe(24)

    async def gauges(self, http: httpx.AsyncClient) -> Gauges:
        agents_cpu = sum(await asyncio.gather(*(s.call("cpu") for s in self.swarms)))
        sent: dict[str, float] = {}
        sent_bytes = read_s = compile_s = 0.0
        for replica in self.replicas:
            text = (await http.get(f"{replica.url}/metrics")).text
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name == "meridian_snapshots_sent_total":
                        kind = sample.labels["kind"]
                        sent[kind] = sent.get(kind, 0) + sample.value
                    elif sample.name == "meridian_snapshot_sent_bytes_total":
                        sent_bytes += sample.value
                    elif sample.name == "meridian_compile_seconds_total":
                        if sample.labels["phase"] == "read":
                            read_s += sample.value
                        else:
                            compile_s += sample.value
        return Gauges(
            time.monotonic(),
            sum(cpu_seconds(r.process.pid, children=False) for r in self.replicas),
            tree_cpu_s(self.postgres_pid),
            agents_cpu,
            sent_bytes,
            sent,
            read_s,
            compile_s,
        )

    async def measure(self, stack: AsyncExitStack) -> dict[str, Any]:
        options, console, root = self.options, self.console, self.options.root / str(self.agents)
        postgres = EmbeddedPostgres(root / "postgres")
        credentials = await postgres.start()
        stack.push_async_callback(postgres.stop)
        self.postgres_pid = server_pid(postgres.pid_file) or 0
        db_url = credentials.url("postgres")
        db = Database.connect(db_url, pool_size=1)
        await migrate.upgrade(db.engine)
        await db.close()
        env = {
            "MERIDIAN_DATABASE_URL": db_url,
            "MERIDIAN_ADMIN_TOKEN": self.token,
            "MERIDIAN_LOG_LEVEL": os.environ.get("MERIDIAN_LOG_LEVEL", "warning"),
            "MERIDIAN_KMS_KEY_FILE": str(root / "kek.json"),  # the replicas share it
        }
        if options.replicas > 1:
            endpoint, _ = await stack.enter_async_context(running_etcd(root / "etcd"))
            env["MERIDIAN_ETCD_ENDPOINTS"] = endpoint
        for _ in range(options.replicas):
            replica = await start_control_plane(env)
            stack.push_async_callback(stop_child, replica.process)
            self.replicas.append(replica)
        console.print(
            f"[green]✓[/] PostgreSQL, {options.replicas} control-plane replica(s) "
            f"(pids {', '.join(str(r.process.pid) for r in self.replicas)})"
        )
        for _ in range(options.agent_processes):
            swarm = SwarmProcess(options.heartbeat_s)
            stack.push_async_callback(swarm.close)
            self.swarms.append(swarm)
        headers = {"Authorization": f"Bearer {self.token}"}
        async with httpx.AsyncClient(headers=headers, timeout=120) as http:
            return await self._rounds(http)

    async def _rounds(self, http: httpx.AsyncClient) -> dict[str, Any]:
        options, console = self.options, self.console
        url = self.replicas[0].url
        rss = {"started": self._rss()}
        doc = fleet_document(self.agents, min(options.regions, self.agents))
        applied = await http.post(
            f"{url}/v1/apply",
            content=yaml.safe_dump(doc).encode(),
            headers={"Content-Type": "application/yaml"},
        )
        applied.raise_for_status()
        tokens = {}
        for region in doc["regions"]:
            made = await http.post(f"{url}/v1/bootstrap-tokens", json={"region": region["name"]})
            made.raise_for_status()
            tokens[region["name"]] = made.json()["token"]
        nodes = [
            {**n, "target": self.replicas[i % len(self.replicas)].grpc_target}
            for i, n in enumerate(doc["nodes"])
        ]
        shares = [nodes[i :: len(self.swarms)] for i in range(len(self.swarms))]
        with Progress(console=console, transient=True) as progress:
            started = time.monotonic()
            task = progress.add_task("registering agents", total=len(nodes))
            advance = lambda n: progress.advance(task, n)  # noqa: E731
            await asyncio.gather(
                *(s.call("register", tokens, share, progress=advance)
                  for s, share in zip(self.swarms, shares, strict=True))
            )  # fmt: skip
            registered_s = time.monotonic() - started
            rss["registered"] = self._rss()
            started = time.monotonic()
            task = progress.add_task("opening streams, first snapshots", total=len(nodes))
            await asyncio.gather(*(s.call("connect", progress=advance) for s in self.swarms))
            connected_s = time.monotonic() - started
        rss["connected"] = self._rss()
        console.print(
            f"[green]✓[/] {self.agents} agents registered in {registered_s:.1f} s, "
            f"connected with their first snapshot in {connected_s:.1f} s"
        )
        await asyncio.sleep(2.0)  # the first heartbeats' writes settle
        before = await self.gauges(http)
        await asyncio.sleep(IDLE_S)
        idle = (await self.gauges(http)).minus(before)
        samples: list[float] = []
        spent: list[dict[str, float]] = []
        with console.status(f"{options.rounds} rounds of write → every ack"):
            for round_ in range(options.rounds):
                before = await self.gauges(http)
                started = time.monotonic()
                response = await http.patch(
                    f"{url}/v1/tenants/bench",
                    json={"requests_per_minute": 1000 * (round_ + 2)},  # every share moves
                    headers={"If-Match": "*"},
                )
                response.raise_for_status()
                revision = int(response.headers["X-Meridian-Revision"])
                acked = await asyncio.gather(
                    *(s.call("acked", revision, 120.0) for s in self.swarms)
                )
                samples.extend(t - started for times in acked for t in times)
                spent.append((await self.gauges(http)).minus(before))
                await asyncio.sleep(0.5)
        resyncs = sum(await asyncio.gather(*(s.call("resyncs") for s in self.swarms)))
        memory = [rss_mb(r.process.pid) for r in self.replicas]
        return summary(self.agents, options, samples, spent, idle, memory, resyncs) | {
            "register_s": round(registered_s, 2),
            "connect_s": round(connected_s, 2),
            "cp_rss_started_mb": rss["started"],
            "cp_rss_registered_mb": rss["registered"],
            "cp_rss_connected_mb": rss["connected"],
        }

    def _rss(self) -> float:
        """The replicas' resident memory now (the largest), MB."""
        return round(max(rss_mb(r.process.pid)[0] for r in self.replicas), 1)


def summary(
    agents: int,
    options: Options,
    samples: list[float],
    spent: list[dict[str, float]],
    idle: dict[str, float],
    memory: list[tuple[float, float]],
    resyncs: int,
) -> dict[str, Any]:
    rounds = len(spent)

    def per_round(key: str) -> float:
        return sum(s[key] for s in spent) / rounds

    background = idle["replicas_cpu"] / idle["seconds"]  # heartbeats and polls, per second
    push_cpu = per_round("replicas_cpu") - background * per_round("seconds")
    return {
        "agents": agents,
        "replicas": options.replicas,
        "regions": min(options.regions, agents),
        "rounds": rounds,
        "samples": len(samples),
        "p50_s": round(percentile(samples, 0.50), 4),
        "p99_s": round(percentile(samples, 0.99), 4),
        "max_s": round(max(samples), 4),
        "cp_cpu_ms_per_agent": round(per_round("replicas_cpu") / agents * 1000, 4),
        "cp_push_cpu_ms_per_agent": round(max(0.0, push_cpu) / agents * 1000, 4),
        "cp_background_cpu_per_s": round(background, 3),
        "bytes_per_agent": round(per_round("sent_bytes") / agents, 1),
        "full_per_round": per_round("full"),
        "delta_per_round": per_round("delta"),
        "pg_read_ms_per_round": round(per_round("read_s") * 1000, 2),
        "compile_ms_per_round": round(per_round("compile_s") * 1000, 2),
        "postgres_cpu_ms_per_round": round(per_round("postgres_cpu") * 1000, 1),
        "postgres_background_cpu_per_s": round(idle["postgres_cpu"] / idle["seconds"], 3),
        "agents_cpu_ms_per_round": round(per_round("agents_cpu") * 1000, 1),
        "cp_peak_rss_mb": round(max(peak for _, peak in memory), 1),
        "cp_peak_rss_mb_sum": round(sum(peak for _, peak in memory), 1),
        "cp_rss_mb": round(max(now for now, _ in memory), 1),
        "resyncs": resyncs,
        "heartbeat_s": options.heartbeat_s,
        "agent_processes": options.agent_processes,
    }


async def run(options: Options) -> list[dict[str, Any]]:
    console = Console()
    results: list[dict[str, Any]] = []
    for agents in options.agents:
        console.rule(f"{agents} agents, {options.replicas} replica(s)")
        async with AsyncExitStack() as stack:
            result = await Run(options, agents, console).measure(stack)
        streams = agents // options.replicas  # a replica's share
        opened = result["cp_rss_connected_mb"] - result["cp_rss_registered_mb"]
        result["cp_kb_per_stream"] = round(opened * 1024 / streams, 1)
        with console.status(f"a bare gRPC server holding {streams} streams, for comparison"):
            result |= await asyncio.to_thread(stream_floor.measure, streams)
        results.append(result)
        _report(console, results)
        write_json(console, {"runs": results}, options.out)  # kept if a later count fails
    return results


ROWS = [
    ("p50_s", "write → ack, p50 s", "{:.3f}"),
    ("p99_s", "write → ack, p99 s", "{:.3f}"),
    ("max_s", "write → ack, max s", "{:.3f}"),
    ("cp_push_cpu_ms_per_agent", "CP CPU per agent per write, ms", "{:.3f}"),
    ("cp_cpu_ms_per_agent", "... with the heartbeats meanwhile, ms", "{:.3f}"),
    ("cp_background_cpu_per_s", "CP CPU when idle (heartbeats), s/s", "{:.3f}"),
    ("bytes_per_agent", "bytes sent per agent per write", "{:,.0f}"),
    ("delta_per_round", "deltas per write", "{:,.0f}"),
    ("full_per_round", "whole snapshots per write", "{:,.0f}"),
    ("pg_read_ms_per_round", "compile: reading PostgreSQL, ms", "{:.1f}"),
    ("compile_ms_per_round", "compile: the rest, ms", "{:.1f}"),
    ("postgres_cpu_ms_per_round", "PostgreSQL CPU per write, ms", "{:.0f}"),
    ("postgres_background_cpu_per_s", "PostgreSQL CPU when idle, s/s", "{:.3f}"),
    ("cp_rss_started_mb", "CP memory when started, MB", "{:.0f}"),
    ("cp_rss_registered_mb", "... with the fleet and agents registered, MB", "{:.0f}"),
    ("cp_rss_connected_mb", "... with every stream open, MB", "{:.0f}"),
    ("cp_kb_per_stream", "... per open stream, KB", "{:.1f}"),
    ("bare_kb_per_stream", "a bare gRPC server, per open stream, KB", "{:.1f}"),
    ("cp_peak_rss_mb", "CP peak memory (one replica), MB", "{:.0f}"),
    ("cp_rss_mb", "CP memory after the rounds, MB", "{:.0f}"),
    ("agents_cpu_ms_per_round", "simulated agents' CPU per write, ms", "{:.0f}"),
    ("register_s", "registering every agent, s", "{:.1f}"),
    ("connect_s", "connecting, first snapshots, s", "{:.1f}"),
]


def _report(console: Console, results: list[dict[str, Any]]) -> None:
    table = Table(title="write → ack of every agent, and what it cost")
    table.add_column("per round (one write)")
    for result in results:
        table.add_column(f"{result['agents']:,} agents, {result['replicas']} CP", justify="right")
    for key, title, form in ROWS:
        table.add_row(title, *(form.format(r[key]) for r in results))
    console.print(table)
    console.print(
        "CP CPU per write is the replicas' CPU time during the round less what the heartbeats "
        "take in as long (measured idle); PostgreSQL's CPU includes the heartbeats' writes; "
        "the simulated agents run in processes of their own, measured apart."
    )
