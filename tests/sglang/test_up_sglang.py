"""`meridian up --engines sglang` before its engines start: SGLang's environment is found,
the tiny model written, and the fleet document, its model pointed at that model, applies."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import yaml
from rich.console import Console

from meridian import real_engines
from meridian.procs import stop_child
from tests.kits.controlplane import start_server
from tests.kits.push import ADMIN
from tests.sglang.kit import sglang_python


async def test_the_sglang_fleet_applies_with_the_model_made_here(
    database_url: str, tmp_path: Path
) -> None:
    sglang_python()  # installed: prepare() finds it and installs nothing
    said = io.StringIO()
    resolved = real_engines.prepare(tmp_path, real_engines.SGLANG_FLEET, Console(file=said))
    assert "SGLang 0.5.23 at" in said.getvalue()
    document = yaml.safe_load(resolved.read_text())
    source = Path(document["models"][0]["source"])
    assert source.is_absolute()
    assert (source / "tokenizer.json").is_file()
    assert (source / "model.safetensors").is_file()
    cp = await start_server(database_url)
    try:
        async with httpx.AsyncClient(base_url=cp.url, headers=ADMIN, timeout=30) as http:
            applied = await http.post(
                "/v1/apply", content=resolved.read_text(),
                headers={"Content-Type": "application/yaml"},
            )  # fmt: skip
            assert applied.status_code == 200, applied.text
            deployments = (await http.get("/v1/deployments")).json()
    finally:
        await stop_child(cp.process)
    items = deployments["items"] if isinstance(deployments, dict) else deployments
    assert {d["backend"] for d in items} == {"sglang"}
    assert sum(d["replicas"] for d in items) == 3  # two regions, one of them with two
