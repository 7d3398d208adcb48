"""The simulator's LoRA adapters at run time, as SGLang 0.5.23 serves them (its real
counterpart: tests/sglang/test_lora.py): loaded, listed, named by a request, refused when
never loaded, loaded again on use after an unload, the least recently used unloaded past
--max-loaded-loras, and one above --max-lora-rank refused. A real simulator process."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import httpx

from agents.engines import tiny_model
from tests.kits.sim import running_sim

LORA = ("--enable-lora", "--max-lora-rank", "8", "--lora-target-modules", "all",
        "--max-loras-per-batch", "2", "--max-loaded-loras", "2",
        "--lora-load-s", "0.01")  # fmt: skip


async def _chat(http: httpx.AsyncClient, model: str, **more: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return await http.post("/v1/chat/completions", json=body | more)


async def test_adapters_are_loaded_named_reloaded_evicted_and_refused_as_sglang_does(
    tmp_path: Path,
) -> None:
    model = tiny_model.write(tmp_path / "tiny")
    paths = {n: str(tiny_model.write_adapter(tmp_path / n, model, rank=4)) for n in "abc"}
    big = str(tiny_model.write_adapter(tmp_path / "big", model, rank=16))
    async with running_sim(*LORA) as sim, httpx.AsyncClient(base_url=sim.url, timeout=30) as http:

        async def load(name: str, path: str) -> httpx.Response:
            return await http.post("/load_lora_adapter",
                                   json={"lora_name": name, "lora_path": path})  # fmt: skip

        first = await load("a", paths["a"])
        assert first.status_code == 200, first.text
        assert first.json() == {"rid": None, "http_worker_ipc": None, "success": True,
                                "error_message": "",
                                "loaded_adapters": {"a": paths["a"]}}  # fmt: skip
        again = await load("a", paths["a"])
        assert again.status_code == 400
        assert "already loaded" in again.json()["error_message"]
        too_big = await load("big", big)
        assert too_big.status_code == 400
        assert "--max-lora-rank" in too_big.json()["error_message"]
        assert (await load("nowhere", str(tmp_path / "none"))).status_code == 400
        listed = (await http.get("/v1/models")).json()["data"]
        assert [(m["id"], m["parent"]) for m in listed] == [("llama", None), ("a", "llama")]
        assert (await _chat(http, "llama:a")).status_code == 200
        assert (await _chat(http, "llama", lora_path="a")).status_code == 200
        never = await _chat(http, "llama:zzz")
        assert never.status_code == 400
        assert "never been loaded" in never.json()["message"]
        native = await http.post("/generate", json={"text": "hi", "lora_path": "zzz"})
        assert native.status_code == 400
        assert "never been loaded" in native.json()["error"]["message"]
        # past --max-loaded-loras (2) the least recently used goes
        assert (await load("b", paths["b"])).status_code == 200
        assert (await _chat(http, "llama:a")).status_code == 200  # a: used last
        third = await load("c", paths["c"])
        assert third.json()["loaded_adapters"] == {"a": paths["a"], "c": paths["c"]}
        # an adapter unloaded (or evicted) is loaded again when a request names it
        unloaded = await http.post("/unload_lora_adapter", json={"lora_name": "a"})
        assert unloaded.json()["loaded_adapters"] == {"c": paths["c"]}
        gone = await http.post("/unload_lora_adapter", json={"lora_name": "a"})
        assert gone.status_code == 400
        assert gone.json()["loaded_adapters"] is None
        assert (await _chat(http, "llama:b")).status_code == 200
        models = {m["id"] for m in (await http.get("/v1/models")).json()["data"]}
        assert models == {"llama", "b", "c"}


async def test_without_lora_an_adapter_is_refused_and_lora_needs_its_limits() -> None:
    async with running_sim() as sim, httpx.AsyncClient(base_url=sim.url, timeout=30) as http:
        loaded = await http.post("/load_lora_adapter", json={"lora_name": "a", "lora_path": "/x"})
        assert loaded.status_code == 400
        assert "not enabled" in loaded.json()["error_message"]
        asked = await _chat(http, "llama:a")
        assert asked.status_code == 400
        assert "LoRA is not enabled" in asked.json()["message"]
    # --enable-lora without a rank and target modules is refused at start, as SGLang does
    refused = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "meridian", "sim", "--model", "m", "--enable-lora",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(refused.communicate(), 60)
    assert refused.returncode == 2
    assert b"--max-lora-rank and --lora-target-modules" in stderr
