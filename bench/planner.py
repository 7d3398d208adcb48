"""`meridian bench planner`: the capacity planner against fixed peak sizing and independent
per-region autoscaling on utilisation (what a Kubernetes HPA or KEDA does), over two
compressed days of three regions on two clouds whose peaks are offset as across time zones.

This is a model, not the fleet: a discrete-time simulation (1 s steps) of demand, engines and
their start time, run in one process. Meridian's side calls the planner's real core
(`controlplane/services/planner/core.py`: forecast, daily shape, guard rails) every period,
fed what the heartbeats would carry. What it cannot show is measured on real processes
elsewhere: that a scale-down fails no request, and that a model at zero wakes without an
error, are fleet tests (tests/fleet/test_planner.py), not figures of this model.

The model:
- demand per region: a daily curve (trough 20% of peak), peak at 14:00 local time, with
  noise; a day lasts `day_s` seconds (24 min by default: an hour a minute);
- an engine serves `engine_rps` requests a second within the SLO, takes `start_s` to become
  ready, and costs its pool's price a GPU-hour (one GPU) from launch until it stops;
- a request is served within the SLO where its region, or (Meridian only: escalation) a
  peer its residency allows with room to spare, has capacity; otherwise it fails. The US
  regions may serve each other; eu-west's tenants stay in the EU. Meridian's deployments
  have `local_share` (0.55): of a region's demand beyond it, what a cheaper peer can take is
  planned there;
- a minute meets the SLO in a region when at least 99% of its requests were served;
- us-west's pool is spot: preemptions take half its engines, two with a notice (`notice_s`:
  they drain, serving until then, and are replaced at once; the notice makes Meridian's
  planner plan at once, as the leader does) and two without (their requests in flight
  fail);
- the baselines are independent per region and have no escalation: fixed engines sized for
  the peak with 20% headroom; the HPA's rule every 15 s, desired = ceil(engines x
  utilisation / 0.7), with the same scale-down window as the planner's cool-down.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import planner_idle
from controlplane.services.planner.core import (
    DailyShape,
    Deployment,
    Guards,
    Limits,
    Observed,
    plan,
)

MODEL = "llama"


@dataclass(frozen=True)
class Region:
    name: str
    cloud: str
    price: float  # a GPU-hour
    spot: bool
    peak_rps: float
    utc_offset_h: float
    peers: tuple[str, ...]  # where its requests may go (residency)


REGIONS = (
    Region("us-east", "aws", 3.9, False, 40.0, -5, ("us-west",)),
    Region("us-west", "gcp", 2.2, True, 30.0, -8, ("us-east",)),
    Region("eu-west", "gcp", 4.3, False, 35.0, 1, ()),
)


@dataclass(frozen=True)
class Options:
    day_s: float = 1440.0
    days: int = 2
    start_s: float = 25.0
    engine_rps: float = 5.0
    period_s: float = 30.0  # the planner's
    cooldown_s: float = 120.0  # the planner's, and the HPA's scale-down window
    local_share: float = 0.55  # the planner's `autoscale.local_share`
    notice_s: float = 30.0  # a spot preemption's notice (GCP's; AWS gives about 2 min)
    seed: int = 7
    out: Path | None = None
    plot: Path | None = None


def demand(region: Region, t: float, day_s: float, rng: random.Random) -> float:
    hour = (t / day_s * 24 + region.utc_offset_h) % 24
    level = 0.2 + 0.8 * (0.5 + 0.5 * math.cos(2 * math.pi * (hour - 14) / 24))
    return max(0.0, region.peak_rps * level * rng.uniform(0.9, 1.1))


@dataclass
class Engines:
    """A region's engines: when each becomes ready (launch + start time); and those under a
    preemption notice, which serve (and cost) until their machine is taken."""

    ready_at: list[float] = field(default_factory=list)
    leaving: list[float] = field(default_factory=list)  # until when each serves

    def ready(self, t: float) -> int:
        return sum(1 for r in self.ready_at if r <= t)

    def serving(self, t: float) -> int:
        return self.ready(t) + sum(1 for u in self.leaving if u > t)

    def count(self) -> int:
        return len(self.ready_at)

    def billed(self, t: float) -> int:
        return self.count() + sum(1 for u in self.leaving if u > t)

    def resize(self, target: int, t: float, start_s: float) -> None:
        while len(self.ready_at) < target:
            self.ready_at.append(t + start_s)
        if len(self.ready_at) > target:  # the newest go first (starting ones before ready)
            self.ready_at.sort()
            del self.ready_at[target:]

    def lose(self, n: int, t: float, start_s: float, notice_s: float) -> None:
        """`n` ready engines taken back, `notice_s` from now (they drain meanwhile: no new
        work counts on them); replacements launched at once."""
        ready = sorted(r for r in self.ready_at if r <= t)[:n]
        for r in ready:
            self.ready_at.remove(r)
            self.ready_at.append(t + start_s)
            if notice_s > 0:
                self.leaving.append(t + notice_s)


@dataclass
class Tally:
    asked: float = 0.0
    served: float = 0.0
    escalated: float = 0.0
    failed_preempted: float = 0.0
    cost: float = 0.0
    scale_downs: int = 0
    minutes: int = 0
    minutes_met: int = 0
    series: list[dict[str, Any]] = field(default_factory=list)  # a point a minute


def run(options: Options) -> dict[str, Any]:
    events = preemptions(options)
    results = {name: simulate(name, options, events) for name in ("fixed", "hpa", "meridian")}
    report = summary(results, options)
    show(report)
    if options.out is not None:
        options.out.write_text(json.dumps({"options": _options(options), "summary": report,
                                           "series": {n: r.series for n, r in results.items()}},
                                          indent=1))  # fmt: skip
    if options.plot is not None:
        draw(results, options.plot, options.engine_rps)
    return report


def preemptions(options: Options) -> list[tuple[float, bool]]:
    """(when, with notice) in us-west: four through the run, two with notice."""
    total = options.day_s * options.days
    rng = random.Random(options.seed + 1)
    return sorted((rng.uniform(0.2, 0.95) * total, i % 2 == 0) for i in range(4))


def simulate(policy: str, options: Options, events: list[tuple[float, bool]]) -> Tally:
    rng = random.Random(options.seed)  # the same demand for every policy
    engines = {r.name: Engines() for r in REGIONS}
    initial = {r.name: math.ceil(r.peak_rps * 1.2 / options.engine_rps) for r in REGIONS}
    for r in REGIONS:  # fixed: for its peak; the others: for the demand as the run begins
        now = math.ceil(demand(r, 0.0, options.day_s, random.Random(0)) * 1.2 / options.engine_rps)
        engines[r.name].ready_at = [0.0] * (initial[r.name] if policy == "fixed" else now)
    tally = Tally()
    step = Planner(options) if policy == "meridian" else Hpa(options)
    minute: dict[str, list[float]] = {r.name: [0.0, 0.0] for r in REGIONS}
    pending = list(events)
    total = options.day_s * options.days
    t = 0.0
    while t < total:
        asked = {r.name: demand(r, t, options.day_s, rng) for r in REGIONS}
        preempted = False
        while pending and pending[0][0] <= t:
            _, notice = pending.pop(0)
            west = engines["us-west"]
            lost = west.ready(t) // 2
            if not notice:  # taken at once: what its engines ran fails (a second's worth)
                tally.failed_preempted += lost * options.engine_rps * 0.8
            west.lose(lost, t, options.start_s, options.notice_s if notice else 0.0)
            preempted = True
        served = serve(asked, engines, t, options, escalate=policy == "meridian", tally=tally)
        for r in REGIONS:
            minute[r.name][0] += asked[r.name]
            minute[r.name][1] += served[r.name]
            tally.cost += engines[r.name].billed(t) * r.price / 3600
        if policy != "fixed":
            step.tick(t, engines, asked, served, tally, now=preempted)
        t += 1.0
        if int(t) % 60 == 0:
            point: dict[str, Any] = {"t": t}
            for r in REGIONS:
                a, s = minute[r.name]
                met = a <= 0 or s / a >= 0.99
                tally.minutes += 1
                tally.minutes_met += met
                point[r.name] = {"asked_rps": round(a / 60, 2), "engines": engines[r.name].count(),
                                 "ready": engines[r.name].ready(t), "met": met}  # fmt: skip
                minute[r.name] = [0.0, 0.0]
            tally.series.append(point)
    return tally


def serve(
    asked: dict[str, float], engines: dict[str, Engines], t: float, options: Options,
    escalate: bool, tally: Tally,
) -> dict[str, float]:  # fmt: skip
    """What each region's requests got served this second, locally, then by a peer."""
    room = {r.name: engines[r.name].serving(t) * options.engine_rps for r in REGIONS}
    served = {}
    for r in REGIONS:
        local = min(asked[r.name], room[r.name])
        room[r.name] -= local
        served[r.name] = local
    if escalate:
        for r in REGIONS:
            for peer in r.peers:
                more = min(asked[r.name] - served[r.name], room[peer])
                if more > 0:
                    room[peer] -= more
                    served[r.name] += more
                    tally.escalated += more
    tally.asked += sum(asked.values())
    tally.served += sum(served.values())
    return served


class Hpa:
    """Per region, every 15 s: desired = ceil(engines x utilisation / 0.7); down only to the
    highest desired of the scale-down window."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.recent: dict[str, list[tuple[float, int]]] = {r.name: [] for r in REGIONS}

    def tick(self, t: float, engines: dict[str, Engines], asked: dict[str, float],
             served: dict[str, float], tally: Tally, now: bool = False) -> None:  # fmt: skip
        if int(t) % 15:
            return
        o = self.options
        for r in REGIONS:
            e = engines[r.name]
            ready = max(1, e.ready(t))
            utilisation = min(1.0, asked[r.name] / (ready * o.engine_rps))
            desired = max(1, math.ceil(ready * utilisation / 0.7))
            window = [(at, d) for at, d in self.recent[r.name] if t - at < o.cooldown_s]
            window.append((t, desired))
            self.recent[r.name] = window
            target = max(d for _, d in window)
            if target < e.count():
                tally.scale_downs += 1
            e.resize(target, t, o.start_s)


class Planner:
    """Meridian's: the planner's core every period, fed what heartbeats carry."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.rates: dict[str, list[tuple[float, float]]] = {r.name: [] for r in REGIONS}
        self.shapes = {(MODEL, r.name): DailyShape.empty(options.day_s, 96) for r in REGIONS}
        self.sums = {r.name: [0.0, 0.0, 0.0] for r in REGIONS}  # asked, served, seconds
        self.changed: dict[str, float] = {}

    def tick(self, t: float, engines: dict[str, Engines], asked: dict[str, float],
             served: dict[str, float], tally: Tally, now: bool = False) -> None:  # fmt: skip
        """Every period; `now`, at once as well (a preemption notice pokes the leader)."""
        o = self.options
        for r in REGIONS:
            sums = self.sums[r.name]
            sums[0], sums[1], sums[2] = (
                sums[0] + asked[r.name],
                sums[1] + served[r.name],
                sums[2] + 1,
            )
        if int(t) % int(o.period_s) and not now:
            return
        observed, deployments = {}, []
        for r in REGIONS:
            a, s, n = self.sums[r.name]
            rate = a / max(1.0, n)
            self.rates[r.name] = [*self.rates[r.name][-19:], (t, rate)]
            key = (MODEL, r.name)
            self.shapes[key] = self.shapes[key].learn(t, rate)
            observed[key] = Observed(
                at=t, rates=tuple(self.rates[r.name]), inflight=round(rate),
                attainment=(s / a) if a > 0 else None, served_per_engine=o.engine_rps,
                refused_per_s=max(0.0, a - s) / max(1.0, n), ready=engines[r.name].ready(t),
            )  # fmt: skip
            deployments.append(Deployment(
                MODEL, r.name, engines[r.name].count(),
                Limits(1, 40, 0.95, 0.2, False, o.local_share), 1, r.price, o.start_s, 256,
                self.changed.get(r.name), r.peers,
            ))  # fmt: skip
            self.sums[r.name] = [0.0, 0.0, 0.0]
        guards = Guards(now=t, cooldown_s=o.cooldown_s, engine_rps_prior=o.engine_rps)
        for d in plan(deployments, observed, self.shapes, guards):
            if d.change:
                if d.change < 0:
                    tally.scale_downs += 1
                engines[d.region].resize(d.target, t, o.start_s)
                self.changed[d.region] = t


def summary(results: dict[str, Tally], options: Options) -> dict[str, Any]:
    hpa, fixed = results["hpa"].cost, results["fixed"].cost
    out: dict[str, Any] = {}
    for name, r in results.items():
        out[name] = {
            "slo_minutes_met": round(r.minutes_met / max(1, r.minutes), 4),
            "cost": round(r.cost, 2),
            "cost_vs_hpa": round(r.cost / hpa, 3) if hpa else None,
            "cost_vs_fixed": round(r.cost / fixed, 3) if fixed else None,
            "served": round(r.served / max(1.0, r.asked), 5),
            "escalated_share": round(r.escalated / max(1.0, r.asked), 4),
            "failed_by_preemption": round(r.failed_preempted),
            "scale_downs": r.scale_downs,
        }
    idle = planner_idle.idle_to_zero()
    out["idle_to_zero_s"] = idle
    out["goals"] = {
        "slo_minutes_met >= 0.95": out["meridian"]["slo_minutes_met"] >= 0.95,
        "cost <= 0.8 x hpa": out["meridian"]["cost_vs_hpa"] <= 0.8,
        "cost <= 0.6 x fixed": out["meridian"]["cost_vs_fixed"] <= 0.6,
        "served >= 0.999": out["meridian"]["served"] >= 0.999,
        f"an idle model at zero within 600 s (at the defaults: {idle:.0f} s)": idle <= 600,
    }
    return out


def show(report: dict[str, Any]) -> None:
    title = "capacity planner: compressed days, 3 regions, 2 clouds (a model)"
    table = Table("policy", "SLO min", "cost", "/HPA", "/fixed", "served", "escal.",
                  "lost (spot)", "downs", title=title)  # fmt: skip
    for name in ("fixed", "hpa", "meridian"):
        r = report[name]
        table.add_row(name, f"{r['slo_minutes_met']:.1%}", f"{r['cost']:.2f}",
                      f"{r['cost_vs_hpa']:.2f}", f"{r['cost_vs_fixed']:.2f}", f"{r['served']:.3%}",
                      f"{r['escalated_share']:.1%}", str(r["failed_by_preemption"]),
                      str(r["scale_downs"]))  # fmt: skip
    console = Console()
    console.print(table)
    for goal, met in report["goals"].items():
        console.print(f"  {'[green]met[/]' if met else '[red]missed[/]'}: {goal}")


def draw(results: dict[str, Tally], path: Path, engine_rps: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(REGIONS), 1, figsize=(11, 8), sharex=True)
    for ax, region in zip(axes, REGIONS, strict=True):
        points = results["meridian"].series
        minutes = [p["t"] / 60 for p in points]
        ax.plot(minutes, [p[region.name]["asked_rps"] / engine_rps for p in points], "k:",
                label="demand (engines' worth)")  # fmt: skip
        for name, style in (("fixed", "-"), ("hpa", "--"), ("meridian", "-")):
            series = results[name].series
            ax.plot(minutes, [p[region.name]["engines"] for p in series], style, label=name)
        missed = [m for m, p in zip(minutes, points, strict=True) if not p[region.name]["met"]]
        ax.plot(missed, [0] * len(missed), "rx", label="meridian: SLO missed")
        ax.set_ylabel(f"{region.name}\nengines")
    axes[0].legend(loc="upper right", fontsize=7)
    axes[-1].set_xlabel("minute (a day is 24 min)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def _options(options: Options) -> dict[str, Any]:
    return {k: v for k, v in options.__dict__.items() if k not in ("out", "plot")}
