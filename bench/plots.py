"""What the benchmarks write: their figures as JSON, and the plot of modes against load that
the overload and escalation benchmarks share."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console


def write_json(console: Console, result: dict[str, Any], out: Path | None) -> None:
    """The figures as JSON at `out` (its folder made), if asked for."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {out}")


def save(
    console: Console,
    result: dict[str, Any],
    out: Path | None,
    plot: Path | None,
    draw: Callable[[Path], None],
) -> None:
    write_json(console, result, out)
    if plot is not None:
        draw(plot)
        console.print(f"wrote {plot}")


def modes_by_load(
    modes: dict[str, dict[str, dict[str, Any]]],
    path: Path,
    *,
    ttft_key: str,
    xlabel: str,
    log_ttft: bool = False,
) -> None:
    """Goodput and the served requests' TTFT p99, per mode, at each multiple of capacity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for mode, runs in modes.items():
        loads = list(runs)
        left.plot(loads, [runs[x]["goodput_rps"] for x in loads], marker="o", label=mode)
        right.plot(loads, [runs[x][ttft_key] for x in loads], marker="o", label=mode)
    left.set_ylabel("goodput, requests/s within SLO")
    right.set_ylabel("TTFT p99 of served requests, s")
    if log_ttft:
        right.set_yscale("log")
    for ax in (left, right):
        ax.set_xlabel(xlabel)
        ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
