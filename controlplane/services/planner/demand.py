"""What the planner reads of the heartbeats: per (model, region), the arrival rate over a
window, the work in flight, the TTFT SLO's attainment, refusals for want of capacity, and what
one engine was seen to serve within the SLO. No I/O: the loop feeds it each live node's
latest heartbeat every period.

The counters in a heartbeat are totals since its gateway started, so a period's figures are
the difference from the node's heartbeat the period before (all of it after a restart, as the
rollouts read them: rollouts/counts.py). A node seen for the first time gives no rate yet.

Demand is what a region's clients asked of its gateways for a model: answers served (by any
engine, a peer's too: escalated work still wants local engines), refusals for want of
capacity and server errors; not what a tenant's own limits refused, nor malformed requests,
nor what peer regions escalated here (`received_by_code`: their clients' demand, counted
where it was asked, so that no request is planned for twice). The engines' pace counts every
answer they gave, a peer's requests too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controlplane.services.planner.core import Observed
from controlplane.services.rollouts.counts import REFUSALS, Counts, Reading, above

WINDOW = 20  # periods of rates kept per (model, region): the trend's window
# refused for want of capacity: the queue was full, or no engine could take it
WANTING = REFUSALS | {"no_healthy_worker", "not_ready"}
MIN_TIMED = 5  # answers timed in a period: fewer say nothing of the SLO's attainment
BUSY = 0.5  # engines running at least this share of their slots, or with a queue, are busy:
# only then does what they served say what they can serve


@dataclass(frozen=True)
class Heartbeat:
    node: str
    region: str
    at: float  # its observed_at, in seconds since the epoch
    telemetry: Mapping[str, Any]


@dataclass
class _Period:
    asked: float = 0.0  # a second
    ok: float = 0.0
    wanting: float = 0.0
    ttft: Counts = field(default_factory=Counts)
    inflight: int = 0  # running or waiting, on its engines or in its gateways' admission
    queued: int = 0  # of those, waiting
    ready: int = 0


def asked(counts: Counts) -> int:
    """Requests this region's clients asked of it that wanted an engine: served, refused for
    want of one, or failed on one; not those a peer region escalated here (its clients'
    demand, counted where they asked)."""
    return _wanted(counts.codes) - _wanted(counts.received)


def _wanted(codes: Mapping[str, int]) -> int:
    return sum(n for code, n in codes.items()
               if code == "ok" or code in WANTING or code.startswith("http_5")
               or code in ("internal_error", "upstream_failed"))  # fmt: skip


@dataclass
class DemandTracker:
    """Fed every period; keeps each (model, region)'s rates and each engine's learned pace."""

    window: int = WINDOW
    _last: dict[str, tuple[float, Reading]] = field(default_factory=dict)
    # per node, per model: its last period's (asked/s, ok/s, wanting/s, TTFT histogram)
    _node_periods: dict[str, dict[str, tuple[float, float, float, dict[float, int]]]] = field(
        default_factory=dict
    )
    rates: dict[tuple[str, str], deque[tuple[float, float]]] = field(default_factory=dict)
    paces: dict[tuple[str, str], float] = field(default_factory=dict)  # answers/s an engine

    def observe(
        self,
        now: float,
        heartbeats: Iterable[Heartbeat],
        slo_s: Mapping[tuple[str, str], float | None],
        targets: Mapping[tuple[str, str], tuple[float, int]],
    ) -> dict[tuple[str, str], Observed]:
        """This period's figures, by (model, region). `slo_s`: the TTFT SLO in seconds of
        its routing policy (None: none set); `targets`: of those planned, the attainment
        target and an engine's slots."""
        periods: dict[tuple[str, str], _Period] = {}
        fresh: dict[str, float] = {}  # region: its freshest heartbeat
        rated: set[str] = set()  # regions with a node that gave rates (not its first beat)
        for beat in heartbeats:
            fresh[beat.region] = max(fresh.get(beat.region, 0.0), beat.at)
            reading = Reading.from_telemetry(dict(beat.telemetry))
            for engine in reading.engines:
                period = periods.setdefault((str(engine.get("model", "")), beat.region),
                                            _Period())  # fmt: skip
                queued = int(engine.get("queued_requests") or 0)
                period.inflight += int(engine.get("inflight_requests") or 0) + queued
                period.queued += queued
                period.ready += engine.get("state") == "ready"
            for answers in beat.telemetry.get("answers", []):  # held by the gateway's admission
                waiting = int(answers.get("waiting") or 0)
                period = periods.setdefault((str(answers.get("model", "")), beat.region),
                                            _Period())  # fmt: skip
                period.inflight += waiting
                period.queued += waiting
            last = self._last.get(beat.node)
            if last is None or beat.at > last[0]:
                self._last[beat.node] = (beat.at, reading)
                if last is not None:  # the first gives totals since its gateway started
                    self._node_periods[beat.node] = _node_rates(reading.minus(last[1]),
                                                            beat.at - last[0])  # fmt: skip
            if beat.node in self._node_periods:
                rated.add(beat.region)
            # a node with no heartbeat since the last period counts at its last rates
            for model, (rate, ok, wanting, ttft) in self._node_periods.get(beat.node, {}).items():
                period = periods.setdefault((model, beat.region), _Period())
                period.asked += rate
                period.ok += ok
                period.wanting += wanting
                if last is None or beat.at > last[0]:
                    period.ttft.add(Counts(ttft=ttft))
        latest: dict[tuple[str, str], Observed] = {}
        for key in sorted(periods.keys() | self.rates.keys() | targets.keys()):
            model, region = key
            if region not in fresh:
                continue  # no live node: nothing to say of it (the plan holds it)
            period = periods.get(key, _Period())
            rates = self.rates.setdefault(key, deque(maxlen=self.window))
            if region in rated:  # a model nobody asked for there: a rate of 0
                rates.append((now, period.asked))
            if not rates:
                continue  # no rate yet (a new leader's first period): the plan holds it
            target, slots = targets.get(key, (0.95, 256))
            attainment = _attainment(period.ttft, slo_s.get(key))
            self._learn(key, period, attainment, target, slots)
            latest[key] = Observed(
                at=fresh[region],
                rates=tuple(rates),
                inflight=period.inflight,
                queued=period.queued,
                attainment=attainment,
                served_per_engine=self.paces.get(key),
                refused_per_s=period.wanting,
                ready=period.ready,
            )
        return latest

    def _learn(
        self, key: tuple[str, str], period: _Period, attainment: float | None, target: float,
        slots: int,
    ) -> None:  # fmt: skip
        """An engine's pace: raised by what busy engines served within the SLO, lowered to
        what they served while missing it with a queue."""
        if period.ready <= 0 or period.ok <= 0 or attainment is None:
            return
        pace = period.ok / period.ready
        busy = period.queued > 0 or period.inflight >= BUSY * slots * period.ready
        known = self.paces.get(key)
        if attainment >= target and busy:
            self.paces[key] = pace if known is None else max(known, pace)
        elif attainment < target and period.queued > 0:
            self.paces[key] = pace if known is None else min(known, pace)

    def forget(self, keep: set[str]) -> None:
        """Nodes no longer live: their next heartbeat starts afresh."""
        self._last = {n: v for n, v in self._last.items() if n in keep}
        self._node_periods = {n: v for n, v in self._node_periods.items() if n in keep}


def _node_rates(
    counts: Mapping[str, Counts], elapsed: float
) -> dict[str, tuple[float, float, float, dict[float, int]]]:
    return {
        model: (asked(c) / elapsed, c.codes.get("ok", 0) / elapsed,
                sum(c.codes.get(code, 0) - c.received.get(code, 0) for code in WANTING)
                / elapsed, c.ttft)
        for model, c in counts.items()
    }  # fmt: skip


def _attainment(ttft: Counts, slo_s: float | None) -> float | None:
    buckets = ttft.ttft
    timed = max(buckets.values(), default=0)
    if slo_s is None or timed < MIN_TIMED:
        return None
    return max(0.0, 1.0 - above(buckets, slo_s) / timed)
