"""The agent daemon against a real control plane: engines, nacks, and life without the control
plane. Everything runs as child processes: the control plane, the agent, the simulators."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from agents.engines.children import start_ticks
from meridian.procs import free_port, start_control_plane, stop_child
from tests.kits.agents import AgentProc, engines_ready, running_agent, start_agent
from tests.kits.controlplane import ADMIN_TOKEN, Server, kek_file, start_server
from tests.kits.push import bootstrap_token, eventually, get, patch, seed


async def _status_when(agent: Any, check: Any, within_s: float = 30) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        status: dict[str, Any] = await agent.status()
        return status if check(status) else None

    result: dict[str, Any] = await eventually(probe, within_s=within_s)
    return result


@contextlib.asynccontextmanager
async def agent_of(
    database_url: str, data_dir: Path, region: str
) -> AsyncIterator[tuple[Server, AgentProc, int]]:
    """A control plane with the example fleet, and an agent on the region's declared node."""
    cp = await start_server(database_url)
    try:
        revision = await seed(cp.url)
        token = await bootstrap_token(cp.url, region)
        node = f"{region}-1"
        async with running_agent(cp.grpc_target, region, data_dir, token=token, node=node) as agent:
            yield cp, agent, revision
    finally:
        await stop_child(cp.process)


async def test_agent_runs_the_node_engines_and_reports_them(
    database_url: str, tmp_path: Path
) -> None:
    async with agent_of(database_url, tmp_path, "us-east") as (cp, agent, revision):
        status = await _status_when(agent, lambda s: engines_ready(s, 3))
        node = await eventually(lambda: _applied(cp.url, "us-east-1", revision), within_s=15)
        async with httpx.AsyncClient(timeout=5) as client:
            models = (await client.get("http://127.0.0.1:30001/v1/models")).json()
            traffic = asyncio.create_task(_same_prompt_again_and_again(client))
            try:
                load = await eventually(lambda: _served(cp.url, "us-east"), within_s=30)
            finally:
                traffic.cancel()
    assert status["node"] == "us-east-1"
    assert status["revision"] == revision
    assert status["source"] == "control-plane"
    assert status["control_plane"]["connected"] is True
    engines = {e["id"]: e for e in status["engines"]}
    assert engines["llama-us-east/unified-0"]["gpus"] == [0]
    assert engines["qwen-us-east/prefill-0"]["gpus"] == [1, 2]  # tp 2: two GPUs, none shared
    assert engines["qwen-us-east/decode-0"]["gpus"] == [3, 4]
    assert {e["backend"] for e in engines.values()} == {"sim"}
    assert [g["index"] for g in status["gpus"]] == [0, 1, 2, 3, 4]
    assert {g["source"] for g in status["gpus"]} == {"declared"}
    assert models["data"][0]["id"] == "qwen2.5-32b-instruct"
    assert node["status"]["health"] == "up"
    assert node["status"]["last_heartbeat_at"] is not None  # telemetry arrives
    # ...with what the engines served, read from their metrics, rolled up for the region
    assert load["prefix_cache_hit_rate"] > 0.5
    assert load["ttft_ms"]["p50"] > 0
    assert load["engines_ready"] == 3
    # each model's start time, launch to ready, from its engines' heartbeats
    models = {m["model"]: m for m in load["models"]}
    assert {m: models[m]["engines_ready"] for m in models} == {
        "llama-3.1-8b-instruct": 1,
        "qwen2.5-32b-instruct": 2,
    }
    assert all(0 < models[m]["start_s"] < 30 for m in models), models


async def _same_prompt_again_and_again(client: httpx.AsyncClient) -> None:
    body = {"text": "a prompt the cache will know", "sampling_params": {"max_new_tokens": 2}}
    while True:
        await client.post("http://127.0.0.1:30000/generate", json=body)
        await asyncio.sleep(0.05)


async def _served(url: str, region: str) -> dict[str, Any] | None:
    load: dict[str, Any] | None = (await get(url, f"/v1/regions/{region}"))["status"]["load"]
    return load if load and load["requests_per_second"] > 0 else None


async def _applied(url: str, node: str, revision: int) -> dict[str, Any] | None:
    found: dict[str, Any] = await get(url, f"/v1/nodes/{node}")
    done = (
        found["status"]["applied_revision"] == revision
        and found["status"]["last_heartbeat_at"] is not None
    )
    # health turns `up` on the liveness sweep after the stream opens, not with it
    return found if done and found["status"]["health"] == "up" else None


async def test_a_snapshot_the_node_cannot_run_is_nacked_and_the_old_one_kept(
    database_url: str, tmp_path: Path
) -> None:
    async with agent_of(database_url, tmp_path, "us-west") as (cp, agent, revision):
        before = await _status_when(agent, lambda s: engines_ready(s, 1))
        bad = {"engine_args": {"no-such-flag": 1}}
        await patch(cp.url, "/v1/deployments/llama-us-west", bad)
        node = await eventually(lambda: _nacked(cp.url, "us-west-1"), within_s=15)
        after = await agent.status()
    assert "no-such-flag" in node["status"]["last_nack_reason"]
    assert node["status"]["applied_revision"] == revision
    assert node["status"]["desired_revision"] > revision
    assert after["revision"] == revision
    assert after["engines"][0]["pid"] == before["engines"][0]["pid"]  # left running as it was
    assert after["engines"][0]["state"] == "ready"


async def _nacked(url: str, node: str) -> dict[str, Any] | None:
    found: dict[str, Any] = await get(url, f"/v1/nodes/{node}")
    return found if found["status"]["last_nack_reason"] else None


async def test_an_agent_restarted_while_the_control_plane_is_down_comes_back_from_disk(
    database_url: str, tmp_path: Path
) -> None:
    port, grpc_port = free_port(), free_port()
    env = {
        "MERIDIAN_DATABASE_URL": database_url,
        "MERIDIAN_ADMIN_TOKEN": ADMIN_TOKEN,
        "MERIDIAN_LOG_LEVEL": "warning",
        "MERIDIAN_KMS_KEY_FILE": kek_file(database_url),
    }
    cp = await start_control_plane(env, port=port, grpc_port=grpc_port)
    target = cp.grpc_target
    try:
        revision = await seed(cp.url)
        token = await bootstrap_token(cp.url, "us-west")
        agent = await start_agent(target, "us-west", tmp_path, token=token, node="us-west-1")
        first = await _status_when(
            agent, lambda s: engines_ready(s, 1) and s["revision"] == revision
        )
    finally:
        await stop_child(cp.process)

    # The control plane is gone, and the agent is killed outright: its engine serves on.
    agent.process.kill()
    await agent.process.wait()
    engine_pid = first["engines"][0]["pid"]
    os.kill(engine_pid, 0)

    # The agent starts again, with no token, from its data dir, and adopts the engine.
    agent = await start_agent(target, "us-west", tmp_path)
    try:
        alone = await _status_when(agent, lambda s: engines_ready(s, 1))
        cp = await start_control_plane(env, port=port, grpc_port=grpc_port)
        try:
            back = await _status_when(agent, lambda s: s["source"] == "control-plane")
        finally:
            await stop_child(cp.process)
    finally:
        await agent.stop()
    assert alone["revision"] == revision
    assert alone["source"] == "disk"
    assert alone["control_plane"]["connected"] is False
    assert alone["node"] == "us-west-1"
    assert alone["engines"][0]["pid"] == engine_pid  # adopted, not restarted
    assert back["revision"] == revision
    assert back["engines"][0]["pid"] == engine_pid
    assert start_ticks(engine_pid) is None  # a clean stop ends the adopted engine too (or
    # leaves a zombie for init to reap: it was the killed agent's child)
