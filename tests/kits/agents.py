"""Node agents as real child processes (`meridian agent run`), for the tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agents.engines.children import reap_strays
from meridian import procs
from meridian.procs import stop_child

FAST = {
    "MERIDIAN_AGENT_HEARTBEAT_S": "1",
    "MERIDIAN_AGENT_RECONNECT_MIN_S": "0.2",
    "MERIDIAN_AGENT_RECONNECT_MAX_S": "1",
    "MERIDIAN_AGENT_PROBE_INTERVAL_S": "0.3",
    "MERIDIAN_AGENT_DRAIN_TIMEOUT_S": "2",
    "MERIDIAN_AGENT_STOP_GRACE_S": "3",
}


@dataclass(eq=False)
class AgentProc:
    process: asyncio.subprocess.Process
    url: str
    operator: str | None = None  # the agent's operator token, when it has one
    data_dir: Path | None = None

    async def status(self) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.operator}"} if self.operator else {}
        async with httpx.AsyncClient(timeout=5, headers=headers) as client:
            response = await client.get(f"{self.url}/agent/status")
            assert response.status_code == 200, response.text
            body: dict[str, Any] = response.json()
            return body

    async def stop(self) -> int:
        await stop_child(self.process, grace_s=20)
        STARTED.discard(self)
        self.reap()
        return self.process.returncode or 0

    def reap(self) -> None:
        """Stop the engines this agent left behind: an engine outlives an agent killed -9 (a
        restarted one adopts it), and one left serving would hold its port for the next test."""
        if self.data_dir is not None and self.process.returncode is not None:
            reap_strays(self.data_dir / "engines", set())


OPERATOR = "agent-kit-operator-token"  # an agent's operator token, unless a test gives one
STARTED: set[AgentProc] = set()  # stopped after each test by tests/conftest.py, if still up


async def stop_leftovers() -> None:
    """Agents a test started and did not stop (it failed first), with their engines."""
    for agent in list(STARTED):
        await agent.stop()


async def start_agent(
    control_plane: str,
    region: str,
    data_dir: Path,
    *,
    token: str | None = None,
    node: str = "",
    operator: str | None = None,
    port: int | None = None,
    inside: list[str] | None = None,
    host: str = "127.0.0.1",
    env: dict[str, str] | None = None,
) -> AgentProc:
    """Started by the one kit (meridian/procs.py), with the settings that make tests quick.
    `inside`: a prefix that runs it elsewhere (a network namespace), listening on `host`;
    `env`: more settings (MERIDIAN_AGENT_*); `operator` "": none given (the agent makes its
    own)."""
    operator = None if operator == "" else operator or OPERATOR
    child = await procs.start_agent(
        control_plane, region, data_dir, node=node, host=host, port=port,
        bootstrap_token=token, operator_token=operator, env={**FAST, **(env or {})},
        inside=inside or (), ready_timeout_s=10,
    )  # fmt: skip
    agent = AgentProc(child.process, child.url, operator, data_dir)
    STARTED.add(agent)
    return agent


@contextlib.asynccontextmanager
async def running_agent(
    control_plane: str, region: str, data_dir: Path, **kwargs: Any
) -> AsyncIterator[AgentProc]:
    agent = await start_agent(control_plane, region, data_dir, **kwargs)
    try:
        yield agent
    finally:
        await agent.stop()


def engines_ready(status: dict[str, Any], count: int) -> bool:
    engines = status["engines"]
    return len(engines) == count and all(e["state"] == "ready" for e in engines)
