"""A region to send requests to: a control plane on the example fleet, an agent whose gateway
serves it, and the simulated engines the agent runs, all real processes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from meridian.procs import stop_child
from tests.kits.agents import AgentProc, engines_ready, running_agent
from tests.kits.controlplane import Server, start_server
from tests.kits.push import admin, bootstrap_token, eventually, seed

OPERATOR = "operator-token-0123456789"


@dataclass
class Region:
    cp: Server
    agent: AgentProc
    revision: int

    @property
    def base_url(self) -> str:
        return f"{self.agent.url}/v1"

    @property
    def agent_headers(self) -> dict[str, str]:
        """The agent's operator token, which /agent/* needs."""
        return {"Authorization": f"Bearer {self.agent.operator}"}

    async def admin(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return await admin(self.cp.url, method, path, body)

    async def api_key(self, tenant: str) -> str:
        return str((await self.admin("POST", "/v1/api-keys", {"tenant": tenant}))["key"])

    async def applied(self, revision: int | None = None) -> dict[str, Any]:
        """The agent's status once it runs the control plane's newest revision."""
        want = revision or int((await self.admin("GET", "/v1/revision"))["revision"])

        async def probe() -> dict[str, Any] | None:
            status = await self.agent.status()
            return status if status["revision"] is not None and status["revision"] >= want else None

        result: dict[str, Any] = await eventually(probe, within_s=20)
        return result


@contextlib.asynccontextmanager
async def region_of(
    database_url: str,
    data_dir: Path,
    region: str,
    engines: int,
    token: str | None = None,
    agent_env: dict[str, str] | None = None,
) -> AsyncIterator[Region]:
    """The example fleet's region with its node's agent, once its engines are ready.
    `agent_env`: more agent settings (MERIDIAN_AGENT_*)."""
    cp = await start_server(database_url)
    try:
        revision = await seed(cp.url)
        bootstrap = await bootstrap_token(cp.url, region)
        node = f"{region}-1"
        async with running_agent(
            cp.grpc_target, region, data_dir, token=bootstrap, node=node, operator=token,
            env=agent_env,
        ) as agent:  # fmt: skip

            async def ready() -> bool:
                return engines_ready(await agent.status(), engines)

            await eventually(ready, within_s=30)
            yield Region(cp, agent, revision)
    finally:
        await stop_child(cp.process)


async def sim_load(url: str) -> int:
    """Requests an engine holds, running or waiting, as it says itself."""
    async with httpx.AsyncClient(timeout=5) as http:
        ranks = (await http.get(f"{url}/v1/loads")).json()["loads"]
    return sum(int(r["num_running_reqs"]) + int(r["num_waiting_reqs"]) for r in ranks)
