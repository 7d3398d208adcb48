"""The real SGLang in the suite: its environment (installed by ./scripts/test, outside the
clone), the tiny model the project makes, and a region whose agent runs real engines on the
CPU, all real processes. The engines start once per module and run niced."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.engines import sglang_env, tiny_model
from agents.engines.base import Backend, EngineSpec
from agents.engines.children import kill_group, kill_leader
from meridian.procs import free_port, stop_child
from tests.kits.agents import AgentProc, running_agent
from tests.kits.controlplane import Server, start_server
from tests.kits.push import ADMIN, admin, bootstrap_token, eventually

MODEL = "tiny-llama"
REGION = "local"
OPERATOR = "operator-token-0123456789"
READY_WITHIN_S = 240  # two real engines importing torch at once on two busy cores


def sglang_python() -> str:
    """The managed environment's Python; the lane fails (never skips) without it."""
    directory = sglang_env.env_dir()
    if not sglang_env.installed(directory):
        pytest.fail(
            f"SGLang {sglang_env.SGLANG_VERSION} is not installed at {directory}: ./scripts/test "
            "installs it (or `meridian engines sglang-env --install`)"
        )
    return str(sglang_env.python_of(directory))


def fleet(model_dir: Path, gateway_port: int, replicas: int, gpus: int = 4) -> dict[str, Any]:
    """One region, one node (its GPUs declared: slots, on a CPU node), the tiny model served
    by real SGLang engines, routed by cost with the engines' KV events."""
    return {
        "apiVersion": "meridian/v1",
        "clouds": [{"name": "here", "provider": "aws"}],
        "regions": [{"name": REGION, "cloud": "here", "geography": "here", "jurisdiction": "us",
                     "gateway_url": f"http://127.0.0.1:{gateway_port}"}],
        "nodes": [{"name": f"{REGION}-1", "region": REGION, "hostname": "127.0.0.1",
                   "gpus": [{"index": i, "model": "cpu", "memory_gb": 24} for i in range(gpus)]}],
        "models": [{"name": MODEL, "source": str(model_dir), "context_length": 4096,
                    "capabilities": ["chat", "completion"], "min_gpu_memory_gb": 1}],
        "deployments": [{"name": f"{MODEL}-{REGION}", "model": MODEL, "region": REGION,
                         "backend": "sglang", "replicas": replicas}],
        "routing_policies": [{"name": "tiny", "model": MODEL, "policy": "cost",
                              "slo_ttft_ms": 5000, "slo_itl_ms": 2000, "max_queue": 256,
                              "params": {"kv_events": True}}],
        "tenants": [{"name": "acme", "tier": "standard", "requests_per_minute": 1_000_000,
                     "tokens_per_minute": 1_000_000_000}],
    }  # fmt: skip


@dataclass
class RealRegion:
    cp: Server
    agent: AgentProc
    key: str
    model_dir: Path

    @property
    def url(self) -> str:
        return self.agent.url

    async def admin(self, method: str, path: str, body: Any = None) -> Any:
        return await admin(self.cp.url, method, path, body)

    async def engines(self) -> list[dict[str, Any]]:
        engines: list[dict[str, Any]] = (await self.agent.status())["engines"]
        return engines

    async def ready(self, count: int) -> list[dict[str, Any]]:
        async def probe() -> list[dict[str, Any]] | None:
            engines = await self.engines()
            ready = [e for e in engines if e["state"] == "ready"]
            return engines if len(ready) == count == len(engines) else None

        found: list[dict[str, Any]] = await eventually(probe, within_s=READY_WITHIN_S, every_s=1)
        return found

    def headers(self, debug: bool = False) -> dict[str, str]:
        """The tenant's key; with `debug`, the operator's token too, which asks for the
        route (x-meridian-route: the worker chosen, each candidate's matched tokens)."""
        if debug:
            return {"Authorization": f"Bearer {OPERATOR}", "x-meridian-debug": "1"}
        return {"Authorization": f"Bearer {self.key}"}


def route(response: httpx.Response) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(response.headers["x-meridian-route"])
    return found


@contextlib.asynccontextmanager
async def real_region(
    database_url: str, data_dir: Path, replicas: int = 2
) -> AsyncIterator[RealRegion]:
    """A control plane and one agent whose node runs `replicas` real SGLang engines."""
    python = sglang_python()
    model_dir = tiny_model.write(data_dir / "tiny-model")
    port = free_port()
    cp = await start_server(database_url)
    try:
        async with httpx.AsyncClient(base_url=cp.url, headers=ADMIN, timeout=30) as http:
            applied = await http.post("/v1/apply", json=fleet(model_dir, port, replicas))
            assert applied.status_code == 200, applied.text
            made = await http.post("/v1/api-keys", json={"tenant": "acme"})
            assert made.status_code == 201, made.text
            key = str(made.json()["key"])
        token = await bootstrap_token(cp.url, REGION)
        env = {"MERIDIAN_AGENT_SGLANG_PYTHON": python, "MERIDIAN_AGENT_ENGINE_NICE": "10",
               "MERIDIAN_AGENT_PROBE_TIMEOUT_S": "10", "MERIDIAN_AGENT_DRAIN_TIMEOUT_S": "60",
               "MERIDIAN_AGENT_STOP_GRACE_S": "15"}  # fmt: skip
        async with running_agent(
            cp.grpc_target, REGION, data_dir / "agent", token=token, node=f"{REGION}-1",
            operator=OPERATOR, port=port, env=env,
        ) as agent:  # fmt: skip
            region = RealRegion(cp, agent, key, model_dir)
            await region.ready(replicas)
            yield region
    finally:
        await stop_child(cp.process)


@contextlib.asynccontextmanager
async def launched(
    backend: Backend, spec: EngineSpec, log: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    """One engine started as the agent's runner starts it (its backend's command line and
    environment, its own process group), niced; stopped with its group."""
    launch = await asyncio.to_thread(backend.launch, spec)
    with log.open("ab") as out:
        process = await asyncio.create_subprocess_exec(
            "nice", "-n", "10", *launch.argv, env={**os.environ, **launch.env},
            stdout=out, stderr=out, start_new_session=True,
        )  # fmt: skip
    try:
        yield process
    finally:
        kill_leader(process.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), 15)
        kill_group(process.pid, signal.SIGKILL)
        await process.wait()


def engine_spec(backend: str, model_dir: Path, **changes: Any) -> EngineSpec:
    port = free_port()
    base = EngineSpec(
        id=f"conformance-{backend}/unified-0", deployment=f"conformance-{backend}",
        model="tiny", backend=backend, role="unified", url=f"http://127.0.0.1:{port}",
        host="127.0.0.1", port=port, model_source=str(model_dir), context_length=4096,
        kv_events_port=free_port(),
    )  # fmt: skip
    return replace(base, **changes)
