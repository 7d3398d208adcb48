"""The local fleet's agents: one `meridian agent run` per declared node, as child processes.

Each agent listens on a free port of its node's own address; its region's `gateway_url` is
a balancer in front of the region's agents (meridian/local_lb.py). It keeps its identity
and last snapshot under `<data dir>/agents/<node>`, and runs the node's simulated engines.
A bootstrap token is made only for an agent that has no identity yet, so a second `meridian
up` changes nothing in the control plane.
"""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from meridian import procs
from meridian.procs import free_port, stop_child

ENGINES_TIMEOUT_S = 180.0
AGENT_STOP_GRACE_S = 30.0  # it drains and stops its engines first


@dataclass(frozen=True)
class LocalNode:
    name: str
    region: str
    hostname: str  # the node's own loopback address: its agent and engines listen there
    port: int  # its agent's

    @property
    def url(self) -> str:
        return f"http://{self.hostname}:{self.port}"


def local_nodes(fleet: Path) -> list[LocalNode]:
    """The nodes the fleet document declares, each agent on a free port of its address."""
    document: dict[str, Any] = yaml.safe_load(fleet.read_text()) or {}
    return [LocalNode(n["name"], n["region"], n["hostname"], free_port())
            for n in document.get("nodes", []) if n.get("state", "active") == "active"]  # fmt: skip


def gateways(fleet: Path) -> dict[str, tuple[str, int]]:
    """Each region's gateway_url, where its balancer listens (meridian/local_lb.py)."""
    document: dict[str, Any] = yaml.safe_load(fleet.read_text()) or {}
    out = {}
    for region in document.get("regions", []):
        url = urlsplit(region.get("gateway_url") or "")
        if url.hostname and url.port:
            out[region["name"]] = (url.hostname, url.port)
    return out


@dataclass
class RunningAgent:
    node: LocalNode
    process: asyncio.subprocess.Process


async def start_agents(
    stack: AsyncExitStack,
    nodes: list[LocalNode],
    *,
    api: str,
    admin_token: str,
    grpc_target: str,
    data_dir: Path,
    log_dir: Path,
    envs: dict[str, dict[str, str]] | None = None,
) -> list[RunningAgent]:
    """`envs`: more settings of a node's agent, by node (the local cloud's, for spot
    machines)."""
    agents: list[RunningAgent] = []

    async def stop_all() -> None:  # at once: each drains its engines, which takes a while
        await asyncio.gather(*(stop_child(a.process, AGENT_STOP_GRACE_S) for a in agents))

    stack.push_async_callback(stop_all)
    for node in nodes:
        node_dir = data_dir / node.name
        token = None
        if not await asyncio.to_thread((node_dir / "identity.json").exists):
            token = await _bootstrap_token(api, admin_token, node.region)
        child = await procs.start_agent(
            grpc_target, node.region, node_dir, node=node.name, hostname=node.hostname,
            host=node.hostname, port=node.port, bootstrap_token=token,
            operator_token=admin_token,  # one token for the local fleet
            env={"MERIDIAN_AGENT_CONTROL_PLANE_URL": api, **(envs or {}).get(node.name, {})},
            log=log_dir / f"agent-{node.name}.log", ready_timeout_s=None,
        )  # fmt: skip
        agents.append(RunningAgent(node, child.process))
    return agents


async def _bootstrap_token(api: str, admin_token: str, region: str) -> str:
    headers = {"Authorization": f"Bearer {admin_token}"}
    async with httpx.AsyncClient(base_url=api, headers=headers, timeout=30) as client:
        response = await client.post("/v1/bootstrap-tokens", json={"region": region})
        response.raise_for_status()
        return str(response.json()["token"])


async def await_engines(
    console: Console,
    agents: list[RunningAgent],
    admin_token: str,
    timeout_s: float = ENGINES_TIMEOUT_S,
) -> dict[str, dict[str, Any]]:
    """Show each node's engines coming up; the last status of every agent."""
    statuses: dict[str, dict[str, Any]] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("engines ready"), TimeElapsedColumn())  # fmt: skip
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    headers = {"Authorization": f"Bearer {admin_token}"}  # the agents' operator token here
    async with httpx.AsyncClient(timeout=2, headers=headers) as client:
        with Progress(*columns, console=console, transient=True) as progress:
            tasks = {
                a.node.name: progress.add_task(f"{a.node.region} / {a.node.name}", total=None)
                for a in agents
            }
            while loop.time() < deadline:
                for agent in agents:
                    status = await _status(client, agent)
                    if status is None:
                        continue
                    statuses[agent.node.name] = status
                    engines = status["engines"]
                    ready = sum(e["state"] == "ready" for e in engines)
                    total = len(engines) if status["revision"] is not None else None
                    progress.update(tasks[agent.node.name], completed=ready, total=total)
                if len(statuses) == len(agents) and all(_settled(s) for s in statuses.values()):
                    break
                await asyncio.sleep(0.3)
    return statuses


async def _status(client: httpx.AsyncClient, agent: RunningAgent) -> dict[str, Any] | None:
    if agent.process.returncode is not None:
        return None
    with contextlib.suppress(httpx.HTTPError, ValueError):
        response = await client.get(f"{agent.node.url}/agent/status")
        if response.status_code == 200:
            body: dict[str, Any] = response.json()
            return body
    return None


def _settled(status: dict[str, Any]) -> bool:
    """Every engine ready or given up on (crash loop)."""
    return status["revision"] is not None and all(
        e["state"] in ("ready", "crash_loop") for e in status["engines"]
    )


def print_engines(
    console: Console, agents: list[RunningAgent], statuses: dict[str, dict[str, Any]]
) -> None:
    for agent in agents:
        status = statuses.get(agent.node.name)
        where = f"{agent.node.region} / {agent.node.name} (agent {agent.node.url})"
        if agent.process.returncode is not None:
            console.print(f"[red]✗[/] {where}: the agent exited with {agent.process.returncode}")
            continue
        if status is None:
            console.print(f"[red]✗[/] {where}: the agent does not answer")
            continue
        console.print(f"[green]✓[/] {where}, revision {status['revision']}")
        for engine in status["engines"]:
            mark = "[green]✓[/]" if engine["state"] == "ready" else "[red]✗[/]"
            detail = f" ({engine['reason']})" if engine["reason"] else ""
            gpus = ",".join(map(str, engine["gpus"])) or "-"
            line = f"{engine['id']}  {engine['state']}  {engine['url']}  gpus {gpus}{detail}"
            console.print(f"    {mark} {line}")
