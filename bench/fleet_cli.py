"""`meridian bench` commands that run a fleet: a control plane and agents in several regions,
and service classes beside a batch flood (the other single-region ones are in bench/cli.py,
which adds these)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

import click

from bench import adapter_run, batch, classes, escalation, quotas, revocation, rollout
from bench import adapters as adapters_bench
from bench.needs import plot_beside, requires, scratch


@click.command("escalation")
@click.option("--workers", type=click.IntRange(1, 16), default=2, show_default=True,
              help="simulated engines in each of the two regions")  # fmt: skip
@click.option("--seconds", type=click.FloatRange(5, 3600), default=20, show_default=True,
              help="of load in each phase")  # fmt: skip
@click.option("--capacity", type=click.FloatRange(0.1, 1000), default=None,
              help="no sweep: region A's capacity (rps) from an earlier run")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="PNG; default: beside --out")  # fmt: skip
def escalation_command(
    workers: int, seconds: float, capacity: float | None, out: Path | None, plot: Path | None
) -> None:
    """Region A at 1x, 2x and 5x its capacity beside an idle peer, with escalation and
    without; with room; a resident tenant; and A's engines killed."""
    with scratch("escalation") as root:
        options = escalation.Options(
            workers=workers, seconds=seconds, capacity_rps=capacity, out=out,
            plot=plot_beside(out, plot), root=root,
        )  # fmt: skip
        asyncio.run(escalation.run(options))


@click.command("revocation")
@click.option("--regions", type=click.IntRange(2, 20), default=3, show_default=True)
@click.option("--rounds", type=click.IntRange(1, 1000), default=20, show_default=True,
              help="API keys and principals revoked, each phase")  # fmt: skip
@click.option("--signing-rounds", type=click.IntRange(1, 100), default=5, show_default=True,
              help="signing keys rotated at once, each phase")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def revocation_command(regions: int, rounds: int, signing_rounds: int, out: Path | None) -> None:
    """Time from a revocation to the credential failing everywhere (goal: p99 ≤ 1 s): an API
    key in every region, a principal at the admin API, a signing key in every peer region;
    with no rollout, then with one paused midway.

    A control plane and one agent per region, all real processes (bench/revocation.py).
    """
    with scratch("revocation") as root:
        options = revocation.Options(regions, rounds, out, root, signing_rounds)
        asyncio.run(revocation.run(options))


@click.command("rollout")
@click.option("--bake", type=click.FloatRange(1, 600), default=5.0, show_default=True,
              help="seconds each wave is watched")  # fmt: skip
@click.option("--baseline", type=click.FloatRange(5, 600), default=20.0, show_default=True,
              help="seconds of steady traffic with no change, first")  # fmt: skip
@click.option("--good", type=click.IntRange(1, 200), default=20, show_default=True,
              help="good changes, each waited to its end")  # fmt: skip
@click.option("--revocations", type=click.IntRange(1, 200), default=20, show_default=True)
@click.option("--repeat", type=click.IntRange(1, 100), default=3, show_default=True,
              help="runs of each harmful change: containment must hold every time")  # fmt: skip
@click.option("--rps", type=click.FloatRange(0.1, 1000), default=None,
              help="paced requests a second into each region instead of 3 streams each: "
              "light load, where engines are mostly idle")  # fmt: skip
@click.option("--check", "checks", multiple=True, metavar="NAME=VALUE",
              help="a check of the rollout policy, e.g. escalated_share=0.15")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def rollout_command(
    bake: float, baseline: float, good: int, revocations: int, repeat: int,
    rps: float | None, checks: tuple[str, ...], out: Path | None,
) -> None:  # fmt: skip
    """Harmful changes caught at the canary and rolled back, good ones rolled everywhere, and
    key revocation while a rollout is paused, on three regions under steady traffic."""
    with scratch("rollout") as root:
        options = rollout.Options(bake_s=bake, baseline_s=baseline, good=good,
                                  revocations=revocations, repeat=repeat, rps=rps, out=out,
                                  checks=_settings(checks), root=root)  # fmt: skip
        asyncio.run(rollout.run(options))


def _settings(pairs: tuple[str, ...]) -> dict[str, float]:
    out = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise click.BadParameter(f"{pair!r}: NAME=NUMBER", param_hint="--check") from None
    return out


@click.command("quotas")
@click.option("--quota", type=click.IntRange(60, 100_000), default=600, show_default=True,
              help="the tenant's requests a minute (twice that is offered)")  # fmt: skip
@click.option("--phase", type=click.FloatRange(30, 3600), default=75.0, show_default=True,
              help="seconds of each traffic pattern")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="a PNG of the admitted rate per region and the quota over time")  # fmt: skip
def quotas_command(quota: int, phase: float, out: Path | None, plot: Path | None) -> None:
    """A tenant's global quota under traffic that moves between three regions, then with the
    control plane down: leases that follow demand against the static shares, in one run."""
    if plot is not None:
        requires("matplotlib")
    with scratch("quotas") as root:
        options = quotas.Options(quota=quota, phase_s=phase, out=out, plot=plot, root=root)
        asyncio.run(quotas.run(options))


@click.command("classes")
@click.option("--workers", type=click.IntRange(1, 32), default=4, show_default=True)
@click.option("--seconds", type=click.FloatRange(5, 3600), default=60, show_default=True,
              help="of traffic in each mode")  # fmt: skip
@click.option("--capacity", type=click.FloatRange(0.1, 1000), default=None,
              help="no sweep: the region's capacity (rps) from an earlier run")  # fmt: skip
@click.option("--modes", default=",".join(classes.MODES), show_default=True,
              help="comma-separated, from the default list")  # fmt: skip
@click.option("--batch-load", type=click.FloatRange(0.01, 100), default=classes.BATCH_LOAD,
              show_default=True, help="batch offered, as a multiple of capacity")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def classes_command(
    workers: int, seconds: float, capacity: float | None, modes: str, batch_load: float,
    out: Path | None,
) -> None:  # fmt: skip
    """Interactive traffic at 70% of capacity beside batch offered at 3x: service classes,
    one class for all, and strict priority without reservation, side by side."""
    names = modes_of(modes, classes.MODES, "--modes")
    with scratch("classes") as root:
        options = classes.Options(workers=workers, seconds=seconds, capacity_rps=capacity,
                                  batch_load=batch_load, modes=names, out=out,
                                  root=root)  # fmt: skip
        asyncio.run(classes.run(options))


@click.command("batch")
@click.option("--lines", type=click.IntRange(1, 1_000_000), default=10_000, show_default=True)
@click.option("--engines", type=click.IntRange(1, 16), default=2, show_default=True,
              help="simulated engines in each of the three regions")  # fmt: skip
@click.option("--interactive-rps", type=click.FloatRange(0.1, 1000), default=6.0,
              show_default=True, help="each region's own interactive traffic")  # fmt: skip
@click.option("--baseline-seconds", type=click.FloatRange(5, 3600), default=120,
              show_default=True, help="of interactive traffic alone, before the batch")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def batch_command(
    lines: int, engines: int, interactive_rps: float, baseline_seconds: float, out: Path | None
) -> None:
    """A batch of many lines over three regions (night, morning, afternoon where they are),
    on the slack their own interactive traffic leaves: lines by region and local hour, and
    the interactive SLO misses it may be blamed for."""
    with scratch("batch") as root:
        options = batch.Options(lines=lines, engines=engines, interactive_rps=interactive_rps,
                                baseline_s=baseline_seconds, out=out, root=root)  # fmt: skip
        asyncio.run(batch.run(options))


def modes_of(given: str, known: Iterable[str], option: str) -> tuple[str, ...]:
    """A comma-separated choice of `known`, in the order given."""
    names, known = tuple(n.strip() for n in given.split(",") if n.strip()), tuple(known)
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise click.BadParameter(f"unknown: {unknown}; from {', '.join(known)}", param_hint=option)
    return names


@click.command("adapters")
@click.option("--adapters", type=click.IntRange(1, 10_000), default=1000, show_default=True)
@click.option("--engines", type=click.IntRange(1, 16), default=4, show_default=True,
              help="simulated engines in each of the two regions")  # fmt: skip
@click.option("--rate", type=click.FloatRange(0.1, 1000), default=6.0, show_default=True,
              help="requests a second into each region")  # fmt: skip
@click.option("--seconds", type=click.FloatRange(5, 3600), default=45, show_default=True,
              help="of traffic for each contender")  # fmt: skip
@click.option("--load-s", type=click.FloatRange(0, 60), default=0.05, show_default=True,
              help="an engine's time to load an adapter")  # fmt: skip
@click.option("--contenders", default=",".join(adapters_bench.CONTENDERS), show_default=True,
              help="which to run, comma-separated")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def adapters_command(
    adapters: int, engines: int, rate: float, seconds: float, load_s: float,
    contenders: str, out: Path | None,
) -> None:  # fmt: skip
    """Tenants' LoRA adapters with Zipf demand over two regions: Meridian's residency and
    adapter-aware routing against sglang-router's cache_aware and round_robin (which do not
    see adapters): TTFT of adapter and base requests, cold-load stalls; for Meridian the time
    to residency after registration and after an engine's restart, and another tenant's uses."""
    picked = modes_of(contenders, adapters_bench.CONTENDERS, "--contenders")
    if set(picked) & set(adapter_run.PEERS):
        requires("sglang_router")
    with scratch("adapters") as root:
        options = adapters_bench.Options(adapters=adapters, engines=engines, rate=rate,
                                         seconds=seconds, load_s=load_s, out=out,
                                         root=root, contenders=picked)  # fmt: skip
        asyncio.run(adapter_run.run(options))


COMMANDS = (
    adapters_command,
    escalation_command,
    revocation_command,
    rollout_command,
    quotas_command,
    classes_command,
    batch_command,
)
