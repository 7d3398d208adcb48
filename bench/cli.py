"""`meridian bench ...`"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import click

from bench import (
    fidelity,
    fleet_cli,
    ledger,
    migration,
    overhead,
    overload,
    planner,
    quality,
    routing,
    scaledowns,
    tiers,
)
from bench.needs import plot_beside, requires, scratch
from bench.propagation import Options, run
from bench.sim import run as run_sim


@click.group("bench")
def bench() -> None:
    """Benchmarks; each prints a table and can write its figures as JSON."""


def _counts(_: click.Context, __: click.Parameter, value: str) -> list[int]:
    try:
        counts = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter("give agent counts separated by commas, e.g. 1000,5000") from None
    if not counts or any(not 1 <= c <= 50_000 for c in counts):
        raise click.BadParameter("each count must be from 1 to 50,000")
    return counts


@bench.command("propagation")
@click.option(
    "--agents",
    default="100",
    show_default=True,
    callback=_counts,
    help="how many agents; several, comma-separated, run one after another (1000,2500,5000)",
)
@click.option("--regions", type=click.IntRange(1, 100), default=10, show_default=True)
@click.option(
    "--replicas",
    type=click.IntRange(1, 16),
    default=1,
    show_default=True,
    help="control-plane replicas sharing the agents (with etcd, when more than one)",
)
@click.option(
    "--agent-processes",
    type=click.IntRange(1, 64),
    default=2,
    show_default=True,
    help="processes the simulated agents are spread over",
)
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
    agents: list[int],
    regions: int,
    replicas: int,
    agent_processes: int,
    rounds: int,
    heartbeat_s: float,
    out: Path | None,
) -> None:
    """Time from a REST write to the ack of every agent, and what each agent costs.

    Starts PostgreSQL, the control-plane replicas and the simulated agents as processes of
    their own, then times ROUNDS writes that change every region, and reads the control
    plane's CPU time, bytes sent, PostgreSQL time and memory around them.
    """
    root = Path(tempfile.mkdtemp(prefix="meridian-bench-"))
    root.chmod(0o755)  # the embedded PostgreSQL runs as `postgres` when we are root
    options = Options(
        agents=agents,
        regions=regions,
        replicas=replicas,
        agent_processes=agent_processes,
        rounds=rounds,
        heartbeat_s=heartbeat_s,
        out=out,
        root=root,
    )
    try:
        asyncio.run(run(options))
    finally:
        shutil.rmtree(root, ignore_errors=True)


@bench.command("fidelity")
@click.option("--requests", type=click.IntRange(8, 10_000), default=48, show_default=True,
              help="requests at each concurrency level")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the figures as JSON here")  # fmt: skip
def fidelity_command(requests: int, out: Path | None) -> None:
    """The simulator beside the real SGLang: one workload, two engines of each, one router.

    Needs SGLang's environment (`meridian engines sglang-env --install`).
    """
    from agents.engines import sglang_env

    if not sglang_env.installed(sglang_env.env_dir()):
        raise click.ClickException(
            "SGLang is not installed: run `meridian engines sglang-env --install` first"
        )
    with scratch("fidelity") as root:
        asyncio.run(fidelity.run(fidelity.Options(root, requests, out)))


@bench.command("sim")
@click.option("--engines", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 4096), default=64, show_default=True)
@click.option("--seconds", type=click.FloatRange(1, 3600), default=15, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def sim_command(engines: int, concurrency: int, seconds: float, out: Path | None) -> None:
    """The simulator beside its published calibration figure, and the CPU and memory that
    ENGINES simulators and a load generator take on this machine."""
    asyncio.run(run_sim(engines, concurrency, seconds, out))


@bench.command("routing")
@click.option("--workers", type=click.IntRange(2, 32), default=8, show_default=True)
@click.option("--contenders", default=",".join(routing.CONTENDERS), show_default=True,
              help="comma-separated, from the default list")  # fmt: skip
@click.option("--phase-seconds", type=click.FloatRange(5, 3600), default=30, show_default=True,
              help="how long each rate of the capacity sweep sends")  # fmt: skip
@click.option("--start-rps", type=click.FloatRange(0.1, 1000), default=8.0, show_default=True)
@click.option("--growth", type=click.FloatRange(1.05, 4), default=1.5, show_default=True)
@click.option("--speed", type=click.FloatRange(0.05, 10), default=0.5, show_default=True,
              help="each simulated worker's speed (1: an H100); spares the machine")  # fmt: skip
@click.option("--stream-interval", type=click.IntRange(1, 64), default=16, show_default=True,
              help="tokens per stream chunk: keeps event rates within the machine")  # fmt: skip
@click.option("--extra/--no-extra", default=True, show_default=True,
              help="also the hot-prefix, multi-turn and mixed-speed workloads")  # fmt: skip
@click.option("--extra-only-at", type=click.FloatRange(0.1, 1000), default=None,
              help="no sweeps: only the other workloads, taking this as round robin's "
                   "capacity (rps, from an earlier run)")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="PNG; default: beside --out")  # fmt: skip
def routing_command(
    workers: int, contenders: str, phase_seconds: float, start_rps: float, growth: float,
    speed: float, stream_interval: int, extra: bool, extra_only_at: float | None,
    out: Path | None, plot: Path | None,
) -> None:  # fmt: skip
    """Routing policies and sglang-router side by side on the same simulated workers."""
    names = [n.strip() for n in contenders.split(",") if n.strip()]
    unknown = [n for n in names if n not in routing.CONTENDERS]
    if unknown or not names:
        raise click.BadParameter(f"unknown contenders {unknown}", param_hint="--contenders")
    if any(routing.CONTENDERS[n][0] == "sglang" for n in names):
        requires("sglang_router")
    plot = plot_beside(out, plot)
    with scratch("routing") as root:
        options = routing.Options(
            workers=workers, contenders=names, phase_seconds=phase_seconds, start_rps=start_rps,
            growth=growth, speed=speed, stream_interval=stream_interval, extra=extra,
            extra_only_at=extra_only_at, out=out, plot=plot, root=root,
        )  # fmt: skip
        asyncio.run(routing.run(options))


@bench.command("overhead")
@click.option("--requests", type=click.IntRange(50, 100_000), default=1000, show_default=True,
              help="latency samples per router, streamed and not")  # fmt: skip
@click.option("--concurrency", type=click.IntRange(1, 1024), default=32, show_default=True)
@click.option("--seconds", type=click.FloatRange(1, 600), default=10, show_default=True,
              help="of closed-loop load per router, for requests per CPU second")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="PNG; default: beside --out")  # fmt: skip
def overhead_command(
    requests: int, concurrency: int, seconds: float, out: Path | None, plot: Path | None
) -> None:
    """The latency Meridian's gateway and sglang-router add over a null engine, and the
    requests each serves per CPU second."""
    requires("sglang_router")
    plot = plot_beside(out, plot)
    with scratch("overhead") as root:
        options = overhead.Options(
            requests=requests, concurrency=concurrency, seconds=seconds, out=out, plot=plot,
            root=root,
        )  # fmt: skip
        asyncio.run(overhead.run(options))


@bench.command("ledger")
@click.option("--records", type=click.IntRange(1000, 100_000_000), default=1_000_000,
              show_default=True, help="in the database, for the month's report")  # fmt: skip
@click.option("--shipped", type=click.IntRange(1000, 10_000_000), default=100_000,
              show_default=True, help="in one agent's journal, shipped when it starts")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def ledger_command(records: int, shipped: int, out: Path | None) -> None:
    """The usage ledger: a record's cost on the request's path, records shipped a second
    from one agent to PostgreSQL, a month's usage report over many records, and a spend
    budget under concurrency against a check-then-increment limiter."""
    with scratch("ledger") as root:
        asyncio.run(ledger.run(ledger.Options(records=records, shipped=shipped, out=out,
                                              root=root)))  # fmt: skip


@bench.command("overload")
@click.option("--workers", type=click.IntRange(1, 32), default=4, show_default=True)
@click.option("--seconds", type=click.FloatRange(5, 3600), default=20, show_default=True,
              help="of load at each multiple of capacity")  # fmt: skip
@click.option("--capacity", type=click.FloatRange(0.1, 1000), default=None,
              help="no sweep: the region's capacity (rps) from an earlier run")  # fmt: skip
@click.option("--modes", default=",".join(overload.MODES), show_default=True,
              help="comma-separated, from the default list")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="PNG; default: beside --out")  # fmt: skip
def overload_command(
    workers: int, seconds: float, capacity: float | None, modes: str, out: Path | None,
    plot: Path | None,
) -> None:  # fmt: skip
    """One region at 1x, 2x and 5x its capacity, with admission control and without."""
    names = tuple(n.strip() for n in modes.split(",") if n.strip())
    unknown = [n for n in names if n not in overload.MODES]
    if unknown or not names:
        raise click.BadParameter(f"unknown modes {unknown}", param_hint="--modes")
    with scratch("overload") as root:
        options = overload.Options(
            workers=workers, seconds=seconds, capacity_rps=capacity, modes=names, out=out,
            plot=plot_beside(out, plot), root=root,
        )  # fmt: skip
        asyncio.run(overload.run(options))


@bench.command("migration")
@click.option("--streams", type=click.IntRange(1, 500), default=40, show_default=True)
@click.option("--tokens", type=click.IntRange(8, 4096), default=96, show_default=True,
              help="max_tokens of each stream")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def migration_command(streams: int, tokens: int, out: Path | None) -> None:
    """Streams whose engine, then whose region's every engine, is killed mid-answer: how many
    complete, token for token, and the added time to the next token at the cut."""
    with scratch("migration") as root:
        asyncio.run(migration.run(migration.Options(streams, tokens, out=out, root=root)))


@bench.command("scaledowns")
@click.option("--cycles", type=click.IntRange(1, 10_000), default=100, show_default=True,
              help="scale-downs, each followed by a scale-up")  # fmt: skip
@click.option("--senders", type=click.IntRange(1, 256), default=8, show_default=True,
              help="clients streaming one answer after another")  # fmt: skip
@click.option("--tokens", type=click.IntRange(8, 4096), default=96, show_default=True)
@click.option("--drain-s", type=click.FloatRange(0, 600), default=1.0, show_default=True,
              help="the deployment's drain_timeout_s: streams running then migrate")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def scaledowns_command(
    cycles: int, senders: int, tokens: int, drain_s: float, out: Path | None
) -> None:
    """A deployment scaled 3 → 2 engines and back, again and again, under streaming traffic
    on a real fleet: the requests that failed (the goal: none)."""
    with scratch("scaledowns") as root:
        options = scaledowns.Options(cycles, senders, tokens, drain_s, out=out, root=root)
        asyncio.run(scaledowns.run(options))


@bench.command("quality")
@click.option("--engines", type=click.IntRange(3, 8), default=4, show_default=True,
              help="simulated engines in each of the two regions")  # fmt: skip
@click.option("--streams", type=click.IntRange(1, 64), default=4, show_default=True,
              help="concurrent clients into each region")  # fmt: skip
@click.option("--soak", type=click.FloatRange(10, 7200), default=600.0, show_default=True,
              help="seconds of healthy engines (false quarantines)")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def quality_command(engines: int, streams: int, soak: float, out: Path | None) -> None:
    """The quality guard: time and requests until a worker that answers wrong is held, for
    each fault, with canaries and with the detectors alone; false quarantines in a soak of
    healthy engines; the detectors' cost an answer and a chunk."""
    with scratch("quality") as root:
        options = quality.Options(engines=engines, streams=streams, soak_s=soak, out=out, root=root)
        asyncio.run(quality.run(options))


@bench.command("tiers")
@click.option("--easy", type=click.FloatRange(0, 1), default=0.6, show_default=True,
              help="the share of short questions in the mixed workload")  # fmt: skip
@click.option("--chats", type=click.IntRange(5, 1000), default=40, show_default=True,
              help="multi-turn conversations (4 turns each)")  # fmt: skip
@click.option("--judge", default=None, metavar="URL",
              help="a judge of answers (real engines): POST {messages, cheap, strong} -> "
              "{as_good}; the share of cheaper answers as good is reported")  # fmt: skip
@click.option("--judge-sample", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def tiers_command(
    easy: float, chats: int, judge: str | None, judge_sample: int, out: Path | None
) -> None:
    """Tiered routes against the strong model alone, on as many engines: the classifier's cost
    a request, GPU-seconds saved, capacity at 90% SLO, and the multi-turn cache hit rate."""
    with scratch("tiers") as root:
        options = tiers.Options(easy=easy, chats=chats, judge=judge, judge_sample=judge_sample,
                                out=out, root=root)  # fmt: skip
        asyncio.run(tiers.run(options))


@bench.command("planner")
@click.option("--days", type=click.IntRange(1, 30), default=2, show_default=True)
@click.option("--day-s", type=click.FloatRange(600, 86_400), default=1440.0, show_default=True,
              help="a day, compressed: 1440 s is an hour a minute")  # fmt: skip
@click.option("--start-s", type=click.FloatRange(20, 3600), default=25.0, show_default=True,
              help="an engine's start time")  # fmt: skip
@click.option("--seed", type=int, default=7, show_default=True)
@click.option("--local-share", type=click.FloatRange(0, 1), default=0.55, show_default=True,
              help="the planner's autoscale.local_share (1: none planned elsewhere)")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None)
def planner_command(
    days: int, day_s: float, start_s: float, seed: int, local_share: float, out: Path | None,
    plot: Path | None,
) -> None:  # fmt: skip
    """The capacity planner against fixed peak sizing and per-region HPA-style autoscaling,
    over compressed days of 3 regions on 2 clouds (a model: bench/planner.py says which)."""
    options = planner.Options(day_s=day_s, days=days, start_s=start_s, seed=seed, out=out,
                              plot=plot_beside(out, plot), local_share=local_share)  # fmt: skip
    planner.run(options)


for _command in fleet_cli.COMMANDS:
    bench.add_command(_command)
