"""`meridian bench ...`"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import click

from bench.propagation import Options, run
from bench.sim import run as run_sim


@click.group("bench")
def bench() -> None:
    """Benchmarks; each prints a table and can write its figures as JSON."""


@bench.command("propagation")
@click.option("--agents", type=click.IntRange(1, 20_000), default=100, show_default=True)
@click.option("--regions", type=click.IntRange(1, 100), default=10, show_default=True)
@click.option("--rounds", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option(
    "--heartbeat-s",
    type=click.FloatRange(0.5, 60),
    default=5.0,
    show_default=True,
    help="each agent's heartbeat interval, the background load on the control plane",
)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def propagation_command(
    agents: int, regions: int, rounds: int, heartbeat_s: float, out: Path | None
) -> None:
    """Time from a REST write to the ack of every agent.

    Starts PostgreSQL and a control plane as separate processes, connects AGENTS simulated
    agent streams from this process, then times ROUNDS writes that change every region.
    """
    root = Path(tempfile.mkdtemp(prefix="meridian-bench-"))
    root.chmod(0o755)  # the embedded PostgreSQL runs as `postgres` when we are root
    options = Options(
        agents=agents,
        regions=min(regions, agents),
        rounds=rounds,
        heartbeat_s=heartbeat_s,
        out=out,
        root=root,
    )
    try:
        asyncio.run(run(options))
    finally:
        shutil.rmtree(root, ignore_errors=True)


@bench.command("sim")
@click.option("--engines", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 4096), default=64, show_default=True)
@click.option("--seconds", type=click.FloatRange(1, 3600), default=15, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def sim_command(engines: int, concurrency: int, seconds: float, out: Path | None) -> None:
    """The simulator beside its published calibration figure, and the CPU and memory that
    ENGINES simulators and a load generator take on this machine."""
    asyncio.run(run_sim(engines, concurrency, seconds, out))
