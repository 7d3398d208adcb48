"""`meridian up --engines sglang`: the local fleet on the real SGLang, on this machine's CPU.

Before the fleet starts: SGLang's own environment (installed once, outside the project, about
11 GB and 4 to 6 minutes; `meridian engines sglang-env`), the tiny model Meridian makes (in
the data directory, in a second), and the fleet document with its `meridian:tiny-model`
sources pointed at that model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from agents.engines import sglang_env, tiny_model
from agents.engines.cli import install_env

SGLANG_FLEET = Path(__file__).resolve().parents[1] / "examples" / "fleet-sglang.yaml"
TINY_SOURCE = "meridian:tiny-model"
ENGINES_TIMEOUT_S = 600.0  # real engines import torch on a CPU shared by all of them


def prepare(data_dir: Path, fleet: Path, console: Console) -> Path:
    """The fleet document to apply: `fleet` with its tiny model's sources resolved, written
    into the data directory."""
    directory = sglang_env.env_dir()
    if sglang_env.installed(directory):
        console.print(f"[green]✓[/] SGLang {sglang_env.SGLANG_VERSION} at {directory}")
    else:
        console.print(
            f"SGLang {sglang_env.SGLANG_VERSION} is installed once, into {directory} "
            "(about 11 GB, 4 to 6 minutes)"
        )
        install_env(directory)
    model = tiny_model.write(data_dir / "tiny-model")
    console.print(f"[green]✓[/] a tiny Llama at {model} (made here, random weights)")
    document: dict[str, Any] = yaml.safe_load(fleet.read_text())
    for entry in document.get("models", []):
        if entry.get("source") == TINY_SOURCE:
            entry["source"] = str(model)
    resolved = data_dir / fleet.name
    resolved.write_text(yaml.safe_dump(document, sort_keys=False))
    return resolved
