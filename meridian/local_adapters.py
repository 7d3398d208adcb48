"""The local fleet's LoRA adapters: one whose directory is not on this machine (the example
fleet's, say) gets a tiny one made for it in the data directory (PEFT's files, random weights,
the tiny model's shapes: the simulator and SGLang on a CPU both load it), and the document
applied names it there. An adapter whose files are here is left as it is."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from agents.engines import tiny_model


def prepare(data_dir: Path, fleet: Path, console: Console) -> Path:
    """The fleet document to apply: `fleet`, or a copy in the data directory whose adapters
    missing here are made (by absolute paths: the agents resolve them from elsewhere)."""
    data_dir = data_dir.resolve()
    document: dict[str, Any] = yaml.safe_load(fleet.read_text()) or {}
    made = []
    for adapter in document.get("adapters") or []:
        source = str(adapter.get("source", ""))
        if not source.startswith("/") or Path(source).is_dir():
            continue
        name = str(adapter["name"])
        directory = tiny_model.write_adapter(
            data_dir / "adapters" / name, data_dir / "tiny-model", seed=zlib.crc32(name.encode()),
            rank=min(int(adapter.get("rank", 4)), 8),
        )  # fmt: skip
        adapter["source"] = str(directory)
        adapter.pop("digest", None)  # a path on the nodes: checked by nothing
        made.append(name)
    if not made:
        return fleet
    console.print(f"[green]✓[/] LoRA adapter(s) {', '.join(made)} made in "
                  f"{data_dir / 'adapters'} (tiny, random weights)")  # fmt: skip
    resolved = data_dir / fleet.name
    resolved.write_text(yaml.safe_dump(document, sort_keys=False))
    return resolved
