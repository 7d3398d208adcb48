"""sglang-router 0.3.2, unchanged, registers two simulators and routes to both."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path

import httpx

from agents.engines import metrics
from meridian.procs import free_port, stop_child
from tests.kits.sim import Sim, running_sim, sse


async def _served(sim: Sim) -> float:
    async with sim.client() as client:
        text = (await client.get("/metrics")).text
    return metrics.parse(text).requests  # summed over its labels (streamed or not)


async def test_router_routes_generate_and_streamed_chat_to_both_simulators(tmp_path: Path) -> None:
    async with (
        running_sim("--enable-metrics") as one,
        running_sim("--enable-metrics") as two,
    ):
        port = free_port()
        log = (tmp_path / "router.log").open("wb")
        router = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sglang_router.launch_router",
            "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", one.url, two.url,
            "--policy", "round_robin",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            stdout=log, stderr=log,
        )  # fmt: skip
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
                await _until_routing(client, router)
                before = [await _served(one), await _served(two)]
                body = {"text": "route me", "sampling_params": {"max_new_tokens": 4}}
                answers = [await client.post("/generate", json=body) for _ in range(4)]
                chat = {
                    "model": "llama",
                    "messages": [{"role": "user", "content": "stream to me"}],
                    "max_tokens": 3,
                    "stream": True,
                }
                async with client.stream("POST", "/v1/chat/completions", json=chat) as response:
                    status, events = response.status_code, await sse(response)
                after = [await _served(one), await _served(two)]
        finally:
            await stop_child(router, grace_s=5)
            log.close()
    assert all(a.status_code == 200 for a in answers)
    assert all(a.json()["meta_info"]["completion_tokens"] == 4 for a in answers)
    assert status == 200
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    served = [b - a for a, b in zip(before, after, strict=True)]
    assert sum(served) == 5
    assert min(served) >= 2, f"round robin sent {served}"


async def _until_routing(client: httpx.AsyncClient, router: asyncio.subprocess.Process) -> None:
    body = {"text": "ready?", "sampling_params": {"max_new_tokens": 1}}
    for _ in range(150):
        assert router.returncode is None, "sglang-router exited"
        with contextlib.suppress(httpx.HTTPError):
            if (await client.post("/generate", json=body)).status_code == 200:
                return
        await asyncio.sleep(0.2)
    raise AssertionError("sglang-router never routed a request")
