"""What the serving benchmarks run on, all real processes on this machine: simulated engines,
a region (embedded PostgreSQL, a control plane, one or more agents whose gateways route to the
simulators as an external deployment), sglang-router as the peer, and their CPU time.

Every contender is measured on the same simulators; their caches are flushed between phases.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import socket
import sys
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from agents.engines.backends import priority_flags
from bench.procfs import cpu_seconds, machine_busy
from controlplane.db import migrate
from controlplane.db.embedded import EmbeddedPostgres
from controlplane.db.engine import Database
from controlplane.snapshot.placement import KV_EVENTS_PORT_OFFSET
from meridian import procs
from meridian.procs import ControlPlane, free_port, start_control_plane, stop_child, wait_ready

MODEL = "llama"
REGION = "bench"
PAGE_SIZE = 16


def engine_port() -> int:
    """A free port whose KV-events port is free too, both below the ephemeral range and the
    ports of managed engines."""
    for _ in range(200):
        port = 20_000 + secrets.randbelow(7_000)
        if _free(port) and _free(port + KV_EVENTS_PORT_OFFSET):
            return port
    raise RuntimeError("no free port pair for a simulator")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@dataclass
class Sim:
    process: asyncio.subprocess.Process
    url: str
    speed: float


async def start_sims(
    stack: AsyncExitStack,
    count: int,
    *,
    max_total_tokens: int,
    stream_interval: int,
    speeds: list[float] | None = None,
    log_dir: Path,
    extra: tuple[str, ...] = (),
    model: str = MODEL,
) -> list[Sim]:
    sims = []
    for i in range(count):
        port = engine_port()
        speed = speeds[i] if speeds else 1.0
        events = {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port + KV_EVENTS_PORT_OFFSET}",
                  "topic": "kv-events"}  # fmt: skip
        args = [
            "--model", model,
            "--max-total-tokens", str(max_total_tokens),
            "--stream-interval", str(stream_interval),
            "--speed-factor", str(speed),
            "--page-size", str(PAGE_SIZE),
            "--kv-events-config", json.dumps(events),
            "--enable-metrics", "--enable-cache-report", *priority_flags({}), *extra,
        ]  # fmt: skip
        child = await procs.start_sim(
            args, port=port, log=log_dir / f"sim-{model}-{i}.log", ready_timeout_s=None
        )
        stack.push_async_callback(stop_child, child.process)
        sims.append(Sim(child.process, child.url, speed))
    for sim in sims:  # started together, awaited together
        await wait_ready(sim.url, sim.process, 30, path="/ready", what="a simulator")
    return sims


async def start_null_engine(stack: AsyncExitStack, log_dir: Path) -> Sim:
    """`bench/null_engine.py`: an engine that answers at once, so that only what stands before
    it is measured."""
    port = free_port()
    log = (log_dir / "null-engine.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.null_engine", "--port", str(port), stdout=log, stderr=log
    )
    stack.push_async_callback(stop_child, process)
    url = f"http://127.0.0.1:{port}"
    await wait_ready(url, process, 20, path="/ready", what="the null engine")
    return Sim(process, url, 1.0)


async def flush(sims: list[Sim]) -> None:
    """Empty every simulator's prefix cache, once its requests are done."""
    async with httpx.AsyncClient(timeout=5) as http:
        for sim in sims:
            for _ in range(300):
                if (await http.post(f"{sim.url}/flush_cache")).status_code == 200:
                    break
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError(f"{sim.url} stayed busy")


_COUNTER = re.compile(r"^sglang:(prompt_tokens_total|cached_tokens_total)\{[^}]*\} (\S+)$", re.M)


async def cache_counters(sims: list[Sim]) -> tuple[float, float]:
    """Prompt tokens and cached prompt tokens, summed over the simulators."""
    prompt = cached = 0.0
    async with httpx.AsyncClient(timeout=5) as http:
        for sim in sims:
            text = (await http.get(f"{sim.url}/metrics")).text
            for name, value in _COUNTER.findall(text):
                if name == "prompt_tokens_total":
                    prompt += float(value)
                else:
                    cached += float(value)
    return prompt, cached


@dataclass
class CpuMeter:
    """CPU seconds of named groups of processes over a phase, and how busy the machine was."""

    groups: dict[str, list[int]]
    start: dict[str, float] = field(default_factory=dict)
    machine: tuple[float, float] = (0.0, 0.0)

    def begin(self) -> None:
        self.start = {g: sum(cpu_seconds(p) for p in pids) for g, pids in self.groups.items()}
        self.machine = machine_busy()

    def end(self, seconds: float) -> dict[str, float]:
        """Cores used by each group over the phase; `machine` the share of all cores busy."""
        out = {
            g: round((sum(cpu_seconds(p) for p in pids) - self.start[g]) / max(seconds, 1e-9), 3)
            for g, pids in self.groups.items()
        }
        busy, total = machine_busy()
        out["machine_busy"] = round((busy - self.machine[0]) / max(1, total - self.machine[1]), 3)
        return out


@dataclass
class Region:
    """A control plane on an embedded PostgreSQL and `gateways` agents of one region, whose
    workers are the simulators (an external deployment)."""

    cp: ControlPlane
    admin: httpx.AsyncClient
    agents: list[asyncio.subprocess.Process]
    gateway_urls: list[str]
    operator: str
    workers: int

    @property
    def pids(self) -> list[int]:
        return [a.pid for a in self.agents]

    async def route(self, policy: str, params: dict[str, Any], **fields: Any) -> None:
        """Set the region's routing policy: its parameters, SLO and queue in `fields`, and
        its service classes' rules (`classes`; none: the defaults); return once every agent
        runs it."""
        classes: dict[str, Any] | None = fields.pop("classes", None)
        url = f"/v1/routing-policies/{REGION}"
        before = (await self.admin.get(url)).json()
        old, old_classes = before.get("params") or {}, before.get("classes") or {}
        # a merge patch: the parameters of the policy before that this one lacks are removed,
        # and so are the classes' rules
        given = None if classes is None else {**dict.fromkeys(old_classes), **classes}
        body = {"policy": policy, "params": {**dict.fromkeys(old), **params}, **fields,
                "classes": given}  # fmt: skip
        answer = await self.admin.patch(url, json=body, headers={"If-Match": "*"})
        answer.raise_for_status()
        want = int((await self.admin.get("/v1/revision")).json()["revision"])
        await self._settled(want, kv_events=bool(params.get("kv_events")))

    async def tenant_key(self, tenant: str, **spec: Any) -> str:
        """A tenant (`spec`: its requests_per_minute, tokens_per_minute, classes...) and a key
        of it; return once every agent knows the key. `rotated=True`: the key's new secret, its
        old one still taken for an hour (both in the snapshot)."""
        rotated = bool(spec.pop("rotated", False))
        body = {"name": tenant, "tier": "standard", **spec}
        answer = await self.admin.post("/v1/tenants", json=body)
        answer.raise_for_status()
        made = await self.admin.post("/v1/api-keys", json={"tenant": tenant})
        made.raise_for_status()
        if rotated:
            path = f"/v1/api-keys/{made.json()['name']}/rotate"
            made = await self.admin.post(path, json={"overlap_s": 3600})
            made.raise_for_status()
        want = int((await self.admin.get("/v1/revision")).json()["revision"])
        await self._settled(want, kv_events=False)
        key: str = made.json()["key"]
        return key

    async def adapter(self, name: str, tenant: str, rank: int = 8) -> None:
        """A LoRA adapter of the model for `tenant` (a path on the nodes: the gateway's side
        of it, not loaded anywhere); return once every agent knows it."""
        body = {"name": name, "base_model": MODEL, "rank": rank, "tenants": [tenant],
                "source": f"/var/lib/meridian/adapters/{name}"}  # fmt: skip
        (await self.admin.post("/v1/adapters", json=body)).raise_for_status()
        want = int((await self.admin.get("/v1/revision")).json()["revision"])
        await self._settled(want, kv_events=False)

    async def _settled(self, revision: int, kv_events: bool, timeout_s: float = 60) -> None:
        headers = {"Authorization": f"Bearer {self.operator}"}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        async with httpx.AsyncClient(timeout=5, headers=headers) as http:
            for url in self.gateway_urls:
                while True:
                    status = (await http.get(f"{url}/agent/status")).json()
                    router = status["router"]
                    if (
                        (status["revision"] or 0) >= revision
                        and len(router["workers"]) == self.workers
                        and (not kv_events or len(router["kv_events"]) == self.workers)
                    ):
                        break
                    if loop.time() > deadline:
                        raise RuntimeError(f"{url} did not settle on revision {revision}")
                    await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # a load poll of every worker, and subscriptions connected


# Benchmarks compare routing and escalation, and change policies between runs side by side:
# each change is in force at once, as under `strategy: immediate` (bench rollout measures waves).
IMMEDIATE = [{"name": "default", "strategy": "immediate"}]


def fleet_document(urls: list[str], gateways: int, max_queue: int) -> dict[str, Any]:
    return {
        "apiVersion": "meridian/v1",
        "clouds": [{"name": "local", "provider": "onprem"}],
        "regions": [{"name": REGION, "cloud": "local", "geography": "local",
                     "jurisdiction": "local"}],
        "nodes": [{"name": f"{REGION}-{i + 1}", "region": REGION, "hostname": "127.0.0.1"}
                  for i in range(gateways)],
        "models": [{"name": MODEL, "source": "meridian/sim", "context_length": 131072,
                    "capabilities": ["chat", "completion"],
                    "pricing": {"prices": [{"effective_from": "2026-01-01T00:00:00Z",
                                            "input": 0.1, "output": 0.4}]}}],
        "deployments": [{"name": "sims", "model": MODEL, "region": REGION,
                         "backend": "external", "external_urls": urls}],
        "routing_policies": [{"name": REGION, "model": MODEL, "region": REGION,
                              "policy": "round_robin", "max_queue": max_queue}],
        "rollout_policies": IMMEDIATE,
    }  # fmt: skip


async def start_region(
    stack: AsyncExitStack,
    root: Path,
    sims: list[Sim],
    *,
    gateways: int = 1,
    max_queue: int = 100_000,
    agent_env: list[dict[str, str]] | None = None,
) -> Region:
    """`agent_env`: settings of each agent, in order (tracing, for one)."""
    cp, admin = await start_control(stack, root)
    doc = fleet_document([s.url for s in sims], gateways, max_queue)
    await apply(admin, doc)
    operator = secrets.token_urlsafe(24)
    agents, urls = [], []
    for i, node in enumerate(doc["nodes"]):
        env = (agent_env or [])[i] if i < len(agent_env or []) else {}
        process, url = await start_agent(
            stack, root, cp, admin, REGION, node["name"], operator, env=env
        )
        agents.append(process)
        urls.append(url)
    return Region(cp, admin, agents, urls, operator, len(sims))


async def start_control(
    stack: AsyncExitStack, root: Path, env: dict[str, str] | None = None
) -> tuple[ControlPlane, httpx.AsyncClient]:
    """An embedded PostgreSQL and a control plane on it (`env`: more settings), and an admin
    client of it."""
    cp, admin, _ = await start_control_on_db(stack, root, env)
    return cp, admin


async def start_control_on_db(
    stack: AsyncExitStack, root: Path, env: dict[str, str] | None = None
) -> tuple[ControlPlane, httpx.AsyncClient, str]:
    """`start_control`, and its database's URL."""
    postgres = EmbeddedPostgres(root / "postgres")
    credentials = await postgres.start()
    stack.push_async_callback(postgres.stop)
    db_url = credentials.url("postgres")
    db = Database.connect(db_url, pool_size=1)
    await migrate.upgrade(db.engine)
    await db.close()
    token = secrets.token_urlsafe(24)
    settings = {"MERIDIAN_DATABASE_URL": db_url, "MERIDIAN_ADMIN_TOKEN": token,
                "MERIDIAN_LOG_LEVEL": "warning", "MERIDIAN_KMS_KEY_FILE": str(root / "kek.json"),
                **(env or {})}  # fmt: skip
    cp = await start_control_plane(settings)
    stack.push_async_callback(stop_child, cp.process)
    admin = httpx.AsyncClient(
        base_url=cp.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )
    stack.push_async_callback(admin.aclose)
    return cp, admin, db_url


async def apply(admin: httpx.AsyncClient, doc: dict[str, Any]) -> None:
    applied = await admin.post(
        "/v1/apply", content=yaml.safe_dump(doc).encode(),
        headers={"Content-Type": "application/yaml"},
    )  # fmt: skip
    applied.raise_for_status()


async def start_agent(
    stack: AsyncExitStack,
    root: Path,
    cp: ControlPlane,
    admin: httpx.AsyncClient,
    region: str,
    node: str,
    operator: str,
    port: int | None = None,
    env: dict[str, str] | None = None,
) -> tuple[asyncio.subprocess.Process, str]:
    """A node's agent, registered with a fresh bootstrap token; its process and URL."""
    made = await admin.post("/v1/bootstrap-tokens", json={"region": region})
    made.raise_for_status()
    agent = await procs.start_agent(
        cp.grpc_target, region, root / node, node=node, hostname="127.0.0.1", port=port,
        bootstrap_token=made.json()["token"], operator_token=operator, env=env,
        log=root / f"agent-{node}.log", ready_timeout_s=None,
    )  # fmt: skip
    stack.push_async_callback(stop_child, agent.process)
    await wait_ready(agent.url, agent.process, 30, path="/healthz", what="an agent")
    return agent.process, agent.url


@dataclass
class SglangRouter:
    process: asyncio.subprocess.Process
    url: str


async def start_sglang_router(
    stack: AsyncExitStack, policy: str, sims: list[Sim], log_dir: Path
) -> SglangRouter:
    """sglang-router 0.3.2 on the same simulators, offline (it loads their tokenizer)."""
    port = free_port()
    log = (log_dir / f"sglang-router-{policy}.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sglang_router.launch_router",
        "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", *(s.url for s in sims),
        "--policy", policy,
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        "--log-level", "warn",
        env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=log, stderr=log,
    )  # fmt: skip
    stack.push_async_callback(stop_child, process)
    url = f"http://127.0.0.1:{port}"
    await wait_ready(url, process, 60, path="/health", what="sglang-router")
    return SglangRouter(process, url)
