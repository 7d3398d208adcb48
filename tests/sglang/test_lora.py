"""LoRA on the real SGLang 0.5.23, on the CPU: a tiny adapter for the tiny model (made here,
as PEFT saves one) loaded, served and unloaded through the engine's run-time API, as the
agent will drive it (issue 45). SGLang's CPU path pins host memory for LoRA, which torch
refuses without CUDA; the launcher makes pinning a no-op there (agents/engines/cpu_lora).
What this pins down of the engine's contract: the shapes of `/load_lora_adapter` and
`/unload_lora_adapter`, that a request selects an adapter as `base:adapter` (a bare
adapter name is served by the base model), that an adapter never loaded is a 400, and that
one unloaded is loaded again by the engine when a request names it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from meridian_pb.fleet.v1.adapters import digest_of

from agents.adapter_config import AdapterConfig
from agents.adapters.files import AdapterFiles
from agents.adapters.keeper import AdapterKeeper
from agents.config import WorkerSpec
from agents.engines import contract, tiny_model
from agents.engines.backends import SglangBackend
from agents.workers.table import WorkerTable
from tests.sglang.kit import engine_spec, launched, sglang_python

pytestmark = pytest.mark.alone

LORA = (("enable-lora", True), ("max-lora-rank", 8), ("lora-target-modules", "all"),
        ("max-loras-per-batch", 2), ("max-running-requests", 4))  # fmt: skip
STARTUP_S = 600.0
ADAPTER = "acme-support"


async def _ready(http: httpx.AsyncClient, process: asyncio.subprocess.Process) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STARTUP_S
    while loop.time() < deadline:
        assert process.returncode is None, "the engine exited while it started"
        try:
            if (await http.get("/health", timeout=5)).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(1)
    pytest.fail(f"the engine was not healthy within {STARTUP_S} s")


async def _answer(http: httpx.AsyncClient, model: str) -> Any:
    """A greedy answer's text, or the error's (status, message)."""
    body = {"model": model, "messages": [{"role": "user", "content": "hello how are you"}],
            "max_tokens": 12, "temperature": 0}  # fmt: skip
    reply = await http.post("/v1/chat/completions", json=body)
    if reply.status_code != 200:
        return reply.status_code, reply.json()["message"]
    return reply.json()["choices"][0]["message"]["content"]


async def test_a_tiny_adapter_is_loaded_served_and_unloaded_by_the_real_engine(
    tmp_path: Path,
) -> None:
    model = tiny_model.write(tmp_path / "tiny")
    adapter = tiny_model.write_adapter(tmp_path / ADAPTER, model)
    spec = engine_spec("sglang", model, engine_args=LORA)
    backend = SglangBackend(sglang_python(), cpu=True)
    assert any("lora" in note for note in (await asyncio.to_thread(backend.launch, spec)).notes)
    async with (
        launched(backend, spec, tmp_path / "engine.log") as process,
        httpx.AsyncClient(base_url=spec.url, timeout=120) as http,
    ):
        await _ready(http, process)
        ask = {"lora_name": ADAPTER, "lora_path": str(adapter)}
        loaded = await http.post("/load_lora_adapter", json=ask)
        assert loaded.status_code == 200, loaded.text
        assert loaded.json()["success"] is True
        assert loaded.json()["loaded_adapters"] == {ADAPTER: str(adapter)}
        listed = {m["id"]: m for m in (await http.get("/v1/models")).json()["data"]}
        assert listed[ADAPTER]["parent"] == "tiny"
        # as the agent's load poller reads them
        models = (await http.get("/v1/models")).json()
        assert contract.read_adapters(models) == {ADAPTER: str(adapter)}
        info = contract.read_server_info((await http.get("/server_info")).json())
        assert info.lora is True
        assert info.max_loaded_loras is None  # not set: no bound but memory
        base, tuned = await _answer(http, "tiny"), await _answer(http, f"tiny:{ADAPTER}")
        assert isinstance(tuned, str)
        assert tuned != base  # the adapter's weights change the answer
        assert await _answer(http, ADAPTER) == base  # a bare adapter name: the base model
        status, message = await _answer(http, "tiny:nobody")
        assert status == 400
        assert "never been loaded" in message
        again = await http.post("/load_lora_adapter", json=ask)
        assert again.status_code == 400
        assert "already loaded" in again.json()["error_message"]
        unloaded = await http.post("/unload_lora_adapter", json={"lora_name": ADAPTER})
        assert unloaded.status_code == 200, unloaded.text
        assert unloaded.json()["loaded_adapters"] == {}
        gone = await http.post("/unload_lora_adapter", json={"lora_name": ADAPTER})
        assert gone.status_code == 400
        # SGLang remembers where an adapter it unloaded came from: a request naming it
        # loads it again (a cold load the agent must count as one)
        assert await _answer(http, f"tiny:{ADAPTER}") == tuned
        await _the_keeper_loads_a_version_from_its_cache(spec.url, adapter, tmp_path, http)


async def _the_keeper_loads_a_version_from_its_cache(
    url: str, adapter: Path, tmp_path: Path, http: httpx.AsyncClient
) -> None:
    """The agent's keeper loads a registered version (copied into its cache, checked by its
    digest) in place of the one the engine holds, as a new version replaces an old one."""
    table = WorkerTable()
    table.replace([WorkerSpec("e", "tiny", "d", "unified", url, None)])
    entry = table.entries["e"]
    table.holds("e", contract.read_adapters((await http.get("/v1/models")).json()))
    keeper = AdapterKeeper(table, AdapterFiles(tmp_path / "cache"))
    config = AdapterConfig(ADAPTER, "tiny", str(adapter), digest_of(adapter), 4,
                           frozenset({"acme"}))  # fmt: skip
    await keeper.ensure(entry, config)
    cached = str(keeper.files.place(config))
    assert contract.read_adapters((await http.get("/v1/models")).json()) == {ADAPTER: cached}
    assert entry.adapters == {ADAPTER: cached}
    assert keeper.counts[ADAPTER].cold_loads == 1
    assert isinstance(await _answer(http, f"tiny:{ADAPTER}"), str)
