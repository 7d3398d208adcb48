"""A fleet of several regions to test escalation on: a control plane on a real PostgreSQL, the
example fleet's regions each with its agent (gateway and simulated engines), all real
processes. The regions' gateway URLs point at the agents' ports, so that peers reach each
other."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from meridian.procs import free_port, stop_child
from tests.kits.agents import AgentProc, engines_ready, start_agent
from tests.kits.controlplane import Server, start_server
from tests.kits.fleet_docs import example
from tests.kits.netns import Netns
from tests.kits.push import ADMIN, bootstrap_token, eventually

LLAMA = "llama-3.1-8b-instruct"
OPERATOR = "operator-token-0123456789"
HOSTS = {"us-east": "127.0.0.1", "us-west": "127.0.0.2", "eu-west": "127.0.0.3"}


@dataclass
class Fleet:
    cp: Server
    agents: dict[str, AgentProc]  # by region
    keys: dict[str, str]  # tenant: API key

    def client(self, region: str, tenant: str = "acme") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.agents[region].url}/v1", api_key=self.keys[tenant], max_retries=0
        )

    async def status(self, region: str) -> dict[str, Any]:
        return await self.agents[region].status()

    async def escalations(self, region: str) -> dict[tuple[str, str], int]:
        """(direction, peer): count, as the region's agent reports them."""
        counts: dict[tuple[str, str], int] = {}
        for c in (await self.status(region))["escalation"]["counts"]:
            key = (c["direction"], c["peer"])
            counts[key] = counts.get(key, 0) + int(c["count"])
        return counts

    async def kill_engines(self, region: str) -> list[int]:
        """kill -9 every engine of the region's agent; their pids."""
        pids = [e["pid"] for e in (await self.status(region))["engines"] if e.get("pid")]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        return pids

    async def fail_engines(self, region: str, error_rate: float = 1.0) -> None:
        """Every engine of the region answers this share of requests with a 500."""
        await self._set_faults(region, {"error_rate": error_rate}, undoing=error_rate == 0.0)

    async def speed_engines(self, region: str, slow_factor: float) -> None:
        """Every engine of the region takes `slow_factor` times its time (0.001: a thousand
        times faster)."""
        await self._set_faults(region, {"slow_factor": slow_factor}, undoing=slow_factor == 1.0)

    async def _set_faults(self, region: str, faults: dict[str, float], undoing: bool) -> None:
        """Sets the simulator's faults on every engine of the region. Undoing a fault, an
        engine the agent is restarting (its health generation failed while it was set) is
        passed by: it starts again with no fault."""
        async with httpx.AsyncClient(timeout=5) as http:
            for engine in (await self.status(region))["engines"]:
                try:
                    answer = await http.post(f"{engine['url']}/sim/faults", json=faults)
                except httpx.ConnectError:
                    if undoing:
                        continue
                    raise
                assert answer.status_code == 200, answer.text

    async def kill_control_plane(self) -> None:
        self.cp.process.kill()
        await self.cp.process.wait()


def fleet_document(
    ports: dict[str, int],
    change: Callable[[dict[str, Any]], None] | None,
    addresses: dict[str, str] | None = None,
) -> str:
    """The example fleet with llama only (and so no tiered route), gateway URLs at the agents'
    ports; without its rollout policy (the test database's `strategy: immediate` stands)
    unless `change` adds one. acme's quotas are out of reach: the fleet tests drive traffic
    as fast as they can (tests/fleet/test_quotas.py has tenants of its own). Its pools name
    no cloud group unless `change` names one. Its adapter is left out (`example`)."""
    doc = example()
    acme = next(t for t in doc["tenants"] if t["name"] == "acme")
    acme.update(requests_per_minute=10_000_000, tokens_per_minute=10_000_000_000)
    doc["models"] = [m for m in doc["models"] if m["name"] == LLAMA]
    doc["deployments"] = [d for d in doc["deployments"] if d["model"] == LLAMA]
    doc["routing_policies"] = [p for p in doc["routing_policies"] if p["model"] == LLAMA]
    doc.pop("tiered_routes", None)  # its strong tier is qwen's
    for region in doc["regions"]:
        address = (addresses or {}).get(region["name"], "127.0.0.1")
        region["gateway_url"] = f"http://{address}:{ports[region['name']]}"
    if change is not None:
        change(doc)
    return yaml.safe_dump(doc)


@contextlib.asynccontextmanager
async def fleet_of(
    database_url: str,
    data_dir: Path,
    regions: tuple[str, ...] = ("us-east", "us-west", "eu-west"),
    change: Callable[[dict[str, Any]], None] | None = None,
    isolated: dict[str, Netns] | None = None,
    agent_env: dict[str, str] | None = None,
    cp_env: dict[str, str] | None = None,
    region_env: dict[str, dict[str, str]] | None = None,
) -> AsyncIterator[Fleet]:
    """The regions named, each with its agent once its engines are ready. `change` edits the
    fleet document before it is applied; a region in `isolated` runs in its namespace;
    `agent_env` adds settings to every agent, `region_env` to one region's, `cp_env` to the
    control plane (without the MERIDIAN_ prefix)."""
    isolated = isolated or {}
    ports = {r: free_port() for r in HOSTS}
    addresses = {r: ns.inner_ip for r, ns in isolated.items()}
    document = fleet_document(ports, change, addresses)
    # the control plane listens where a namespace reaches it (this side of its pair)
    host = next(iter(isolated.values())).host_ip if isolated else "127.0.0.1"
    cp = await start_server(database_url, host=host, **(cp_env or {}))
    agents: dict[str, AgentProc] = {}
    try:
        async with httpx.AsyncClient(base_url=cp.url, headers=ADMIN, timeout=30) as http:
            applied = await http.post(
                "/v1/apply",
                content=document,
                headers={"Content-Type": "application/yaml"},
            )
            assert applied.status_code == 200, applied.text
            keys = {}
            for tenant in ("acme", "eurobank"):
                made = await http.post("/v1/api-keys", json={"tenant": tenant})
                assert made.status_code == 201, made.text
                keys[tenant] = str(made.json()["key"])
            deployments = applied_deployments(yaml.safe_load(document))
        for region in regions:
            token = await bootstrap_token(cp.url, region)
            ns = isolated.get(region)
            agents[region] = await start_agent(
                cp.grpc_target, region, data_dir / region, token=token, node=f"{region}-1",
                operator=OPERATOR, port=ports[region], inside=ns.run() if ns else None,
                host=ns.inner_ip if ns else "127.0.0.1",
                env={"MERIDIAN_AGENT_CONTROL_PLANE_URL": cp.url, **(agent_env or {}),
                     **(region_env or {}).get(region, {})},
            )  # fmt: skip
        for region, agent in agents.items():

            async def ready(agent: AgentProc = agent, count: int = deployments[region]) -> bool:
                status = await agent.status()
                return engines_ready(status, count) and status["revision"] is not None

            await eventually(ready, within_s=40)
        yield Fleet(cp, agents, keys)
    finally:
        for agent in agents.values():
            await agent.stop()
        await stop_child(cp.process)


def applied_deployments(doc: dict[str, Any]) -> dict[str, int]:
    """Engines per region: its deployments' replicas (a PD one's count prefill and decode)."""
    counts: dict[str, int] = {}
    for d in doc["deployments"]:
        counts[d["region"]] = counts.get(d["region"], 0) + d.get("replicas", 1)
    return counts
