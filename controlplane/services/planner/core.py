"""The capacity planner's core: from what each (model, region) is asked and can serve, how
many engines it should run. A pure function of its inputs, no I/O: a loop in the leader reads
the heartbeats' demand and the fleet, calls `plan`, and acts on or advises what it returns.

Per deployment with an `autoscale` block (the others keep their fixed replicas):

- Demand it cannot trust holds it: if its freshest heartbeat is older than `stale_after_s`
  (a partition, an agent gone), nothing changes, and above all nothing shrinks.
- The forecast is the arrival rate one engine start ahead. It is the larger of two things:
  the recent level and trend (a least-squares line over the last few periods, held to the
  window's own range, and never below the rate asked now), and the (model, region)'s daily
  shape at that time of day
  (`DailyShape`, learned from the days seen).
- Engines needed: the forecast, plus headroom, over what one engine serves within the SLO.
  That is learned from the answers engines gave while the SLO's attainment met its target;
  until then, a prior. Three more rules apply:
  - never fewer than the work in flight needs;
  - one more than now while the SLO is missed with requests waiting;
  - never zero while requests are refused for want of an engine.
  The result is held to [min, max].
- A scale-down waits out the cool-down since the deployment's last change, and removes at
  most half its engines at a time.

Across the fleet, scale-ups are granted first, the largest shortfall first, within the
budgets in GPUs and in money an hour. Then scale-downs, and at most `max_changes` changes in
all. A change not made is returned too, not taken, with its reason, as the audit wants it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Limits:
    """A deployment's `autoscale` block."""

    min_engines: int
    max_engines: int
    target: float = 0.95  # the share of timed answers within the TTFT SLO to keep
    headroom: float = 0.2  # over the forecast
    scale_to_zero: bool = False
    local_share: float = 1.0  # of its demand, served by its own engines at least


@dataclass(frozen=True)
class Deployment:
    model: str
    region: str
    engines: int  # what it is planned to run now
    limits: Limits
    gpus_per_engine: int
    price_per_gpu_hour: float  # of the pool its engines run on
    start_s: float  # how long its engines took to become ready, lately
    max_running: int  # requests an engine runs at once
    last_change_at: float | None = None
    # regions that may serve its demand when it is overloaded (a fallback rule for its model
    # and every tier, within its jurisdiction), in order of preference
    peers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Observed:
    """A (model, region)'s demand, from its agents' heartbeats."""

    at: float  # the freshest heartbeat's time
    rates: Sequence[tuple[float, float]]  # (time, arrivals a second), oldest first
    inflight: int = 0  # requests running or waiting now
    queued: int = 0  # of those, waiting
    attainment: float | None = None  # share of timed answers within the SLO, last period
    served_per_engine: float | None = None  # answers a second an engine gave within the SLO
    refused_per_s: float = 0.0  # refused for want of capacity (queue full, no engine)
    ready: int | None = None  # engines ready now (None: not told)


@dataclass(frozen=True)
class DailyShape:
    """A (model, region)'s arrival rate by time of day: `buckets` equal parts of a day of `day_s`
    seconds (compressed in the benchmark), each the moving average of the rates seen then;
    None where none was seen yet."""

    day_s: float
    rates: tuple[float | None, ...]

    @classmethod
    def empty(cls, day_s: float = 86_400.0, buckets: int = 96) -> DailyShape:
        return cls(day_s, (None,) * buckets)

    def _bucket(self, t: float) -> int:
        return int((t % self.day_s) / self.day_s * len(self.rates)) % len(self.rates)

    def at(self, t: float) -> float | None:
        return self.rates[self._bucket(t)]

    def learn(self, t: float, rate: float, weight: float = 0.3) -> DailyShape:
        """The shape with the rate seen at `t` taken in (the newest days weigh most)."""
        i = self._bucket(t)
        old = self.rates[i]
        new = rate if old is None else (1 - weight) * old + weight * rate
        return replace(self, rates=(*self.rates[:i], new, *self.rates[i + 1 :]))


@dataclass(frozen=True)
class Guards:
    now: float
    stale_after_s: float = 30.0
    cooldown_s: float = 300.0
    max_changes: int = 10  # a period
    gpu_budget: int | None = None  # GPUs in all
    money_budget: float | None = None  # an hour, in all
    engine_rps_prior: float = 1.0  # what one engine serves, before anything is learned


@dataclass(frozen=True)
class Decision:
    model: str
    region: str
    current: int
    target: int  # what it would run; `current` when it holds
    taken: bool  # False: a change the guards or budgets did not allow (`reason` says which)
    reason: str
    forecast_rps: float
    per_engine_rps: float

    @property
    def change(self) -> int:
        return self.target - self.current if self.taken else 0

    def describe(self) -> str:
        """The audit's line: `us-east llama 2→4: ...`."""
        arrow = f"{self.current}→{self.target}" if self.target != self.current else "holds"
        done = "" if self.taken else " (not taken)"
        return f"{self.region} {self.model} {arrow}{done}: {self.reason}"


def start_times(engines: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Per model, how long its engines took to become ready lately: the median of their last
    starts, as the live nodes' heartbeats report them (`EngineStatus.ready_after_s`). A model
    with none known is left out, and the caller's default stands for it."""
    seen: dict[str, list[float]] = {}
    for engine in engines:
        took = float(engine.get("ready_after_s") or 0.0)
        if took > 0:
            seen.setdefault(str(engine.get("model", "")), []).append(took)
    return {model: statistics.median(took) for model, took in sorted(seen.items())}


def forecast(
    rates: Sequence[tuple[float, float]], at: float, shape: DailyShape | None = None
) -> float:
    """The arrival rate expected at `at`: the larger of the trend's and the daily shape's."""
    trend = _trend(rates, at)
    seasonal = shape.at(at) if shape is not None else None
    return max(trend, seasonal or 0.0)


TREND_POINTS = 6  # the slope is the last few periods': a turn in demand shows at once


def _trend(rates: Sequence[tuple[float, float]], at: float) -> float:
    if not rates:
        return 0.0
    last = max(0.0, rates[-1][1])
    recent = rates[-TREND_POINTS:]
    if len(recent) == 1:
        return last
    n = len(recent)
    mean_t = sum(t for t, _ in recent) / n
    mean_r = sum(r for _, r in recent) / n
    spread = sum((t - mean_t) ** 2 for t, _ in recent)
    slope = sum((t - mean_t) * (r - mean_r) for t, r in recent) / spread if spread else 0.0
    line = mean_r + slope * (at - mean_t)
    # the line may run on past what the window saw by at most the window's own range; and a
    # falling one plans no lower than what is asked now (it scales down as demand falls, not
    # before: the turn of a daily curve comes while its fall is still in the window)
    low, high = min(r for _, r in rates), max(r for _, r in rates)
    return max(last, min(line, high + (high - low)))


def plan(
    deployments: Iterable[Deployment],
    observed: Mapping[tuple[str, str], Observed],
    shapes: Mapping[tuple[str, str], DailyShape],
    guards: Guards,
) -> list[Decision]:
    """A decision for every deployment given, in (region, model) order; `observed` and
    `shapes` by (model, region)."""
    deployments = list(deployments)
    needs = {(d.model, d.region): _need(d, observed.get((d.model, d.region)),
                                        shapes.get((d.model, d.region)), guards)
             for d in deployments}  # fmt: skip
    _spill(deployments, needs, guards.now)
    wanted = [_decide(d, needs[(d.model, d.region)], guards) for d in deployments]
    decided = _within_fleet_limits(wanted, {(d.model, d.region): d for d in deployments}, guards)
    return sorted(decided, key=lambda d: (d.region, d.model))


@dataclass
class _Need:
    """What a deployment's demand asks of it, before its bounds and guard rails; None
    engines: it holds (no demand it can trust)."""

    engines: int | None
    why: str
    expected: float = 0.0
    per_engine: float = 1.0
    keep: int = 0  # what it must run itself whatever cheaper peers have: in-flight work
    ready: int | None = None  # engines ready now, as its heartbeats say
    released: int = 0  # given up to cheaper peers that run them already


def _need(d: Deployment, seen: Observed | None, shape: DailyShape | None, guards: Guards) -> _Need:
    limits, now = d.limits, guards.now
    per_engine = (seen.served_per_engine if seen else None) or guards.engine_rps_prior
    if seen is None or now - seen.at > guards.stale_after_s:
        age = "no rate yet" if seen is None else f"the last heartbeat is {now - seen.at:.0f} s old"
        return _Need(None, f"no fresh demand ({age})", per_engine=per_engine)
    expected = forecast(seen.rates, now + d.start_s, shape)
    need = math.ceil(round(expected * (1 + limits.headroom) / per_engine, 6))
    why = (f"forecast {expected:.1f} rps in {d.start_s:.0f} s (start time), "
           f"{per_engine:.2f} rps an engine, headroom {limits.headroom:.0%}")  # fmt: skip
    flight = math.ceil(seen.inflight / max(1, d.max_running))
    if flight > need:
        need, why = flight, f"{seen.inflight} requests in flight need {flight}"
    keep = flight
    missed = seen.attainment is not None and seen.attainment < limits.target
    if missed and seen.queued > 0 and need <= d.engines:
        need = keep = d.engines + 1
        why = (f"SLO attainment {seen.attainment:.0%} under its target {limits.target:.0%} "
               f"with {seen.queued} waiting")  # fmt: skip
    if seen.refused_per_s > 0 and need < 1:
        need, keep = 1, 1
        why = f"{seen.refused_per_s:.1f} rps refused: never zero while refusing"
    # a lull is not idleness: zero only after a whole window of none, for an engine that
    # runs; one at zero wakes only for requests (not for a window not yet heard whole, or
    # a model at zero would start an engine whenever the control plane starts)
    quiet = seen.rates[-QUIET_PERIODS:]
    asked = any(r > 0 for _, r in quiet)
    if need < 1 and (asked or (len(quiet) < QUIET_PERIODS and d.engines > 0)):
        need = 1
        why += f"; asked for within its last {QUIET_PERIODS} periods: one engine"
        why += " kept" if d.engines else ""
    return _Need(need, why, expected, per_engine, keep, seen.ready)


QUIET_PERIODS = 20  # periods with no request before a model may go to zero (the window)
CHEAPER = 0.9  # a peer whose GPUs cost at most this share of a region's is cheaper


def _spill(
    deployments: Sequence[Deployment], needs: dict[tuple[str, str], _Need], now: float
) -> None:
    """Bulk capacity where GPUs are cheaper: of a deployment's demand beyond its
    `local_share`, what cheaper peers of the same model can take within their maximum is
    planned there instead (they serve it by escalation, on overload, as its fallback rules
    say). Never what its in-flight work needs, nor for or onto one that holds.

    Make before break: the peer grows at once, but the region gives up only engines that the
    peer already runs ready beyond its own need, and has had a start time to start; the rest
    it keeps until they stand there. A peer that loses engines (a preemption) so covers less
    at once, and the region grows back while the peer replaces them."""
    by_key = {(d.model, d.region): d for d in deployments}
    own = {key: need.engines for key, need in needs.items()}  # before any spill
    for d in sorted(deployments, key=lambda d: (-d.price_per_gpu_hour, d.region, d.model)):
        need = needs[(d.model, d.region)]
        if need.engines is None or d.limits.local_share >= 1 or not d.peers:
            continue
        keep = max(need.keep, math.ceil(round(need.engines * d.limits.local_share, 6)))
        spare = need.engines - keep
        cheaper = sorted((by_key[(d.model, p)] for p in d.peers if (d.model, p) in by_key
                          and by_key[(d.model, p)].price_per_gpu_hour
                          <= CHEAPER * d.price_per_gpu_hour),
                         key=lambda p: (p.price_per_gpu_hour, d.peers.index(p.region)))  # fmt: skip
        for peer in cheaper:
            there, its_own = needs[(peer.model, peer.region)], own[(peer.model, peer.region)]
            if spare <= 0 or there.engines is None or its_own is None:
                continue
            rps = spare * need.per_engine
            moved = min(peer.limits.max_engines - there.engines,
                        math.ceil(round(rps / there.per_engine, 6)))  # fmt: skip
            if moved <= 0:
                continue
            saving = 1 - peer.price_per_gpu_hour / d.price_per_gpu_hour
            there.engines += moved
            there.why += f"; +{moved} for {d.region}'s demand, {saving:.0%} cheaper here"
            settled = peer.last_change_at is None or now - peer.last_change_at >= peer.start_s
            running = peer.engines if there.ready is None else min(peer.engines, there.ready)
            standing = max(0, running - its_own) if settled else 0
            covered = min(moved, standing) * there.per_engine / need.per_engine
            mine = min(spare, math.floor(round(covered, 6)))
            if mine > 0:
                need.engines -= mine
                need.released += mine
                need.why += f"; {mine} planned in {peer.region} instead, {saving:.0%} cheaper"
            elif moved:
                need.why += f"; {peer.region} starts {moved} to take some of it"
            spare -= min(spare, math.ceil(round(moved * there.per_engine / need.per_engine, 6)))


def _decide(d: Deployment, need: _Need, guards: Guards) -> Decision:
    limits, now, per_engine = d.limits, guards.now, need.per_engine
    expected, why = need.expected, need.why
    if need.engines is None:
        return Decision(d.model, d.region, d.engines, d.engines, True, why, expected, per_engine)
    floor = limits.min_engines if limits.scale_to_zero else max(1, limits.min_engines)
    target = min(limits.max_engines, max(floor, need.engines))
    if target == limits.max_engines and need.engines > target:
        why += f"; held to its maximum, {limits.max_engines}"
    if target >= d.engines:
        return Decision(d.model, d.region, d.engines, target, True, why, expected, per_engine)
    # a scale-down only for engines a cheaper peer runs ready already waits on no cool-down:
    # the demand did not fall, so there is no flapping to damp
    handed_over = target + need.released >= d.engines
    left = guards.cooldown_s - (now - d.last_change_at) if d.last_change_at is not None else 0
    if left > 0 and not handed_over:
        return Decision(d.model, d.region, d.engines, target, False,
                        f"{why}; cool-down: {left:.0f} s left", expected, per_engine)  # fmt: skip
    step = max(target, d.engines - max(1, d.engines // 2))
    if step > target:
        why += f"; down by half at most, to {step}"
    return Decision(d.model, d.region, d.engines, step, True, why, expected, per_engine)


def _within_fleet_limits(
    wanted: list[Decision], by_key: Mapping[tuple[str, str], Deployment], guards: Guards
) -> list[Decision]:
    """Scale-ups within the budgets (largest shortfall first), then scale-downs; at most
    `max_changes` changes."""
    gpus = sum(d.engines * d.gpus_per_engine for d in by_key.values())
    money = sum(d.engines * d.gpus_per_engine * d.price_per_gpu_hour for d in by_key.values())
    out: list[Decision] = []
    changes, many = 0, f"at most {guards.max_changes} changes a period"
    ups = sorted((w for w in wanted if w.taken and w.target > w.current),
                 key=lambda w: (w.current - w.target, w.region, w.model))  # fmt: skip
    downs = [w for w in wanted if w.taken and w.target < w.current]
    for w in ups:
        d = by_key[(w.model, w.region)]
        fits = w.target - w.current
        if guards.gpu_budget is not None:
            fits = min(fits, (guards.gpu_budget - gpus) // max(1, d.gpus_per_engine))
        hourly = d.gpus_per_engine * d.price_per_gpu_hour
        if guards.money_budget is not None and hourly > 0:
            fits = min(fits, math.floor(round((guards.money_budget - money) / hourly, 6)))
        if changes >= guards.max_changes:
            out.append(replace(w, taken=False, reason=f"{w.reason}; {many}"))
            continue
        if fits <= 0:
            out.append(replace(w, taken=False, reason=f"{w.reason}; {_budget(guards)} reached"))
            continue
        if fits < w.target - w.current:
            out.append(replace(w, target=w.current + fits,
                               reason=f"{w.reason}; {_budget(guards)}: {fits} of "
                                      f"{w.target - w.current} more"))  # fmt: skip
        else:
            out.append(w)
        gpus += fits * d.gpus_per_engine
        money += fits * hourly
        changes += 1
    for w in downs:
        if changes >= guards.max_changes:
            out.append(replace(w, taken=False, reason=f"{w.reason}; {many}"))
            continue
        out.append(w)
        changes += 1
    out.extend(w for w in wanted if not w.taken or w.target == w.current)
    return out


def _budget(guards: Guards) -> str:
    named = []
    if guards.gpu_budget is not None:
        named.append(f"{guards.gpu_budget} GPUs")
    if guards.money_budget is not None:
        named.append(f"{guards.money_budget:g} an hour")
    return "the budget of " + " and ".join(named) if named else "the budget"
