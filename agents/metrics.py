"""The agent's Prometheus metrics (`GET /metrics`).

- OpenTelemetry's GenAI server histograms, as Prometheus names, with the conventions' bucket
  boundaries: `gen_ai_server_time_to_first_token_seconds` and
  `gen_ai_server_time_per_output_token_seconds` (streamed answers) and
  `gen_ai_server_request_duration_seconds` (every answer, with `error_type` when it failed),
  by `gen_ai_operation_name` and `gen_ai_request_model`; observed once per request.
- Meridian's own, under `meridian_`: requests by region, model, tenant, status and worker
  (or `peer:<region>`); routing decisions by policy and choice; prompt tokens as routed (the
  router's predicted cache hits) and as the engines report them; admission's queue depth and
  rejections; escalations by direction, peer and reason; circuit breakers; the snapshot's
  revision and age; requests failed by a fault of the gateway's own, and reservations the
  audit found leaked and repaired. The state families are read from the agent when scraped,
  on the event loop (cheap), and rendered off it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agents.books import Books

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0)  # fmt: skip
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                300.0, 600.0)  # fmt: skip
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92)  # fmt: skip
OPERATIONS = {"/v1/chat/completions": "chat", "/v1/completions": "text_completion",
              "/generate": "text_completion"}  # fmt: skip
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Settled(NamedTuple):
    """What one request came to, derived once at its end (agents/gateway/service.py) from
    what arrived, where it went and how it fared: the metrics, its route receipt, its span and
    the per-tenant counts all read it. Immutable, and a tuple: cheap to make on every
    request."""

    model: str = ""
    tenant: str = ""
    worker: str = ""  # the engine's worker id, or peer:<region>
    first_at: float | None = None  # monotonic time of the first byte of a streamed answer
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # as the engine reports them
    routed_prompt: int = 0  # as the router predicted: the prompt, and its cached part
    routed_cached: int = 0
    decision: dict[str, Any] | None = None  # meridian.* attributes of the routing decision
    policy: str = ""  # the routing policy, or "escalation"
    reason: str = ""  # the router's reason, or the escalation's
    came_from: str = ""  # the region that escalated it here
    migrated: str = ""  # where its stream was carried on, and why: "a → b (broke); ..."
    crowded: bool = False  # it waited on another tenant's load (agents/router/admission.py)
    load: float = 0.0  # requests of its model in flight here per serving worker, when sent
    service_class: str = ""  # the class it was served at
    waited_s: float | None = None  # from its arrival to its first call to a worker here
    key: str = ""  # its API key's public prefix
    asked: str = ""  # the model it asked for, where another answered (a tiered route's)
    # its tokens are counted from what its client got (a stream cut, or its client gone,
    # before the engine said its usage): prompt as routed, one completion token an event
    estimated: bool = False
    # answers made for it besides the one it got (a tier's, before the cascade): (model,
    # prompt, cached, completion tokens, the worker that made it)
    extra: tuple[tuple[str, int, int, int, str], ...] = ()
    asked_as: str = ""  # a peer's request: the id its client gave there
    hold: Any = None  # what it may cost, held in its tenant's budgets, settled on its usage
    carried: int | None = None  # a part of a peer's request, which it records (flight.Caller)
    # a stream carried on past a cut: the worker (or peer:<region>) whose answer began it,
    # and the tokens that one made
    began: tuple[str, int] | None = None
    kept: bool = False  # recorded here whole though a peer answered (the peer told so)


Counts = dict[float, int]
Bucketed = list[tuple[float, int]]


class RequestMetrics:
    def __init__(self, region: Callable[[], str]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.region = region
        op, model = "gen_ai_operation_name", "gen_ai_request_model"
        r = self.registry
        self.ttft = Histogram("gen_ai_server_time_to_first_token", "Time to generate first token "
                              "for successful responses", [op, model], unit="seconds",
                              buckets=TTFT_BUCKETS, registry=r)  # fmt: skip
        self.tpot = Histogram("gen_ai_server_time_per_output_token", "Time per output token "
                              "generated after the first token for successful responses",
                              [op, model], unit="seconds", buckets=TPOT_BUCKETS,
                              registry=r)  # fmt: skip
        self.duration = Histogram("gen_ai_server_request_duration", "Generative AI server "
                                  "request duration such as time-to-last byte",
                                  [op, model, "error_type"], unit="seconds",
                                  buckets=DURATION_BUCKETS, registry=r)  # fmt: skip
        self.requests = Counter("meridian_requests", "Requests answered by this gateway",
                                ["region", "model", "tenant", "status", "worker"],
                                registry=r)  # fmt: skip
        self._series: dict[tuple[str, str, str | None], _Series] = {}
        self._requests: dict[tuple[str, str, int, str], Any] = {}
        self.wait = Histogram("meridian_admission_wait", "From a request's arrival to its "
                              "admission, by model and service class", ["model", "class"],
                              unit="seconds", buckets=WAIT_BUCKETS, registry=r)  # fmt: skip
        self._waits: dict[tuple[str, str], Any] = {}
        self.tokens = Counter("meridian_prompt_tokens", "Prompt tokens, and their cached part, "
                              "as routed (the router's prediction) and as the engines report",
                              ["model", "source", "kind"], registry=r)  # fmt: skip

    def answered(self, path: str, status: int, started: float, now: float, served: Settled,
                 error: str | None) -> None:  # fmt: skip
        """One request's observations; the labelled series are looked up once per key and
        kept (prometheus_client's `labels()` takes a lock and builds a key each call)."""
        op, model = OPERATIONS.get(path, "chat"), served.model or "unknown"
        series = self._series.get((op, model, error))
        if series is None:
            series = self._series[op, model, error] = _Series(self, op, model, error)
        series.duration.observe(now - started)
        key = (model, served.tenant, status, served.worker)
        counter = self._requests.get(key)
        if counter is None:
            counter = self._requests[key] = self.requests.labels(
                self.region(), model, served.tenant or "unknown", str(status),
                served.worker or "none",
            )  # fmt: skip
        counter.inc()
        if served.waited_s is not None:
            wait = self._waits.get((model, served.service_class))
            if wait is None:
                wait = self._waits[model, served.service_class] = self.wait.labels(
                    model, served.service_class or "standard"
                )
            wait.observe(served.waited_s)
        if status == 200 and served.first_at is not None:
            series.ttft.observe(served.first_at - started)
            if served.completion_tokens and served.completion_tokens > 1:
                series.tpot.observe((now - served.first_at) / (served.completion_tokens - 1))
        if served.routed_prompt:
            series.routed_prompt.inc(served.routed_prompt)
            series.routed_cached.inc(served.routed_cached)
        if served.prompt_tokens:
            series.engine_prompt.inc(served.prompt_tokens)
            series.engine_cached.inc(served.cached_tokens or 0)

    def wait_totals(self) -> dict[tuple[str, str], Bucketed]:
        """Per (model, class), admission's waits since start, as cumulative (upper bound,
        count) lists."""
        out: dict[tuple[str, str], Bucketed] = {}
        for family in self.wait.collect():
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    key = (sample.labels["model"], sample.labels["class"])
                    out.setdefault(key, []).append((float(sample.labels["le"]), int(sample.value)))
        return {key: sorted(buckets) for key, buckets in out.items()}

    def latency_totals(self) -> dict[str, dict[str, Bucketed]]:
        """Per model, the TTFT and time-per-output-token histograms since start, summed over
        operations, as cumulative (upper bound, count) lists: a heartbeat's, not a request's."""
        raw: dict[str, dict[str, Counts]] = {}
        for key, histogram in (("ttft", self.ttft), ("itl", self.tpot)):
            for family in histogram.collect():
                for sample in family.samples:
                    if not sample.name.endswith("_bucket"):
                        continue
                    model, le = sample.labels["gen_ai_request_model"], float(sample.labels["le"])
                    counts = raw.setdefault(model, {}).setdefault(key, {})
                    counts[le] = counts.get(le, 0) + int(sample.value)
        return {
            model: {key: sorted(counts.items()) for key, counts in kinds.items()}
            for model, kinds in raw.items()
        }


class _Series:
    """The labelled series one (operation, model, error) writes to."""

    def __init__(self, m: RequestMetrics, op: str, model: str, error: str | None) -> None:
        self.duration = m.duration.labels(op, model, error or "")
        self.ttft, self.tpot = m.ttft.labels(op, model), m.tpot.labels(op, model)
        self.routed_prompt = m.tokens.labels(model, "routed", "prompt")
        self.routed_cached = m.tokens.labels(model, "routed", "cached")
        self.engine_prompt = m.tokens.labels(model, "engine", "prompt")
        self.engine_cached = m.tokens.labels(model, "engine", "cached")


class _Scrape:
    """The registry's families and the state's, as one collector for generate_latest."""

    def __init__(self, registry: CollectorRegistry, state: list[Metric]) -> None:
        self.registry, self.state = registry, state

    def collect(self) -> Iterator[Metric]:
        yield from self.registry.collect()
        yield from self.state


async def render(metrics: RequestMetrics, state: Iterable[Metric]) -> bytes:
    """The exposition text; the state's families were read on the loop, rendering is not."""
    return await asyncio.to_thread(generate_latest, _Scrape(metrics.registry, list(state)))


def state_families(
    books: Books,
    *,
    revision: int | None,
    applied_at: float | None,
    waiting: dict[str, int],
    breakers: list[tuple[str, str, str]],
    held: dict[tuple[str, str], str] | None = None,
) -> list[Metric]:
    """Meridian's families that the agent's books and state hold, built on the event loop."""
    rejections, decisions, faults, repairs = (
        books.rejections, books.decisions, books.faults, books.repairs,
    )  # fmt: skip
    escalations = [(d, p, r, n) for (d, p, r), n in sorted(books.escalations.items())]
    migrations, quality = books.migrations, books.quality
    tiered, tier_moves, cascades = books.tier_answered, books.tier_moves, books.cascades
    out: list[Metric] = []
    rev = GaugeMetricFamily("meridian_snapshot_revision", "Revision of the snapshot in force")
    age = GaugeMetricFamily("meridian_snapshot_age_seconds", "Seconds since it was applied")
    if revision is not None:
        rev.add_metric([], revision)
    if applied_at is not None:
        age.add_metric([], time.time() - applied_at)
    out += [rev, age]
    queue = GaugeMetricFamily("meridian_admission_waiting", "Requests waiting in admission",
                              labels=["model"])  # fmt: skip
    for model, n in sorted(waiting.items()):
        queue.add_metric([model], n)
    refused = CounterMetricFamily("meridian_admission_rejections", "Requests admission refused",
                                  labels=["model", "code"])  # fmt: skip
    for (model, code), n in sorted(rejections.items()):
        refused.add_metric([model, code], n)
    chosen = CounterMetricFamily("meridian_routing_decisions", "Routing decisions",
                                 labels=["model", "policy", "choice"])  # fmt: skip
    for (model, policy, choice), n in sorted(decisions.items()):
        chosen.add_metric([model, policy, choice], n)
    flows = CounterMetricFamily(
        "meridian_escalations",
        "Requests escalated out to a peer region or in from one",
        labels=["direction", "peer", "reason"],
    )
    for direction, peer, reason, n in escalations:
        flows.add_metric([direction, peer, reason], n)
    states = GaugeMetricFamily("meridian_circuit_breaker_state", "1 for each breaker's state",
                               labels=["kind", "target", "state"])  # fmt: skip
    for kind, target, state in breakers:
        for s in ("closed", "half_open", "open"):
            states.add_metric([kind, target, s], 1 if s == state else 0)
    ours = CounterMetricFamily("meridian_gateway_faults", "Requests the gateway failed by a "
                               "fault of its own (answered 500, logged)",
                               labels=["model"])  # fmt: skip
    for model, n in sorted(faults.items()):
        ours.add_metric([model], n)
    repaired = CounterMetricFamily("meridian_inflight_repairs", "Requests in flight to a worker "
                                   "that its engine did not hold, ended by the audit",
                                   labels=["worker"])  # fmt: skip
    for worker, n in sorted(repairs.items()):
        repaired.add_metric([worker], n)
    carried = CounterMetricFamily("meridian_gateway_migrations", "Streams whose worker failed "
                                  "mid-answer: carried on in the region or a peer, or ended",
                                  labels=["model", "to", "why"])  # fmt: skip
    for (model, to, why), n in sorted((migrations or {}).items()):
        carried.add_metric([model, to, why], n)
    judged = CounterMetricFamily("meridian_quality_events", "The quality guard's quarantines, "
                                 "readmissions and alerts (agents/quality), by what failed",
                                 labels=["model", "worker", "kind", "check"])  # fmt: skip
    for (model, worker, kind, check), n in sorted((quality or {}).items()):
        judged.add_metric([model, worker, kind, check], n)
    holding = GaugeMetricFamily("meridian_quality_held", "1 for each worker the quality guard "
                                "holds now: quarantined, or alerted on as its model's last",
                                labels=["model", "worker", "state"])  # fmt: skip
    for (model, worker), state in sorted((held or {}).items()):
        holding.add_metric([model, worker, state], 1)
    out += _tier_families(tiered or {}, tier_moves or {}, cascades or {})
    by_class = CounterMetricFamily("meridian_class_requests", "Requests by service class and "
                                   "what became of them: admitted here, shed (refused for "
                                   "load), preempted, escalated to a peer, refused (no worker); "
                                   "requeued (times one gave way), past_slo (admitted streams "
                                   "whose first token came past the route's SLO)",
                                   labels=["model", "class", "outcome"])  # fmt: skip
    for (model, service_class, outcome), n in sorted(books.classes.items()):
        by_class.add_metric([model, service_class, outcome], n)
    out.append(by_class)
    return [*out, queue, refused, chosen, flows, states, ours, repaired, carried, judged, holding]


def _tier_families(
    tiered: dict[tuple[str, str, str], int],
    moves: dict[tuple[str, str, str, str], int],
    cascades: dict[tuple[str, str], int],
) -> list[Metric]:
    answered = CounterMetricFamily("meridian_tier_requests", "Requests to tiered routes, by "
                                   "the tier (model) that answered and why it did",
                                   labels=["route", "model", "why"])  # fmt: skip
    for (route, model, why), n in sorted(tiered.items()):
        answered.add_metric([route, model, why], n)
    moved = CounterMetricFamily("meridian_tier_moves", "Tiered requests moved off the tier "
                                "first chosen: under load (capacity) or by a cascade",
                                labels=["route", "from_model", "to_model", "why"])  # fmt: skip
    for (route, came, went, why), n in sorted(moves.items()):
        moved.add_metric([route, came, went, why], n)
    cascaded = CounterMetricFamily("meridian_tier_cascades", "Cheaper tiers' answers asked "
                                   "again of the strongest, by failure signal",
                                   labels=["route", "signal"])  # fmt: skip
    for (route, signal), n in sorted(cascades.items()):
        cascaded.add_metric([route, signal], n)
    return [answered, moved, cascaded]


# refusals for want of room: those of a request crowded out by another tenant's load are
# counted as "crowded" for the rollout's checks (the client still gets the refusal's own code)
CROWDED_OUT = frozenset({"overloaded", "queue_full"})
# per answer timed: counted, past the SLO, crowded, crowded and past the SLO
TTFT_CODES = ("@timed", "@slow_ttft", "@crowded", "@crowded_slow")
ITL_CODES = ("@itl_timed", "@slow_itl", "@crowded_itl", "@crowded_slow_itl")


def count_by_tenant(
    counts: MutableMapping[tuple[str, str, str], int],  # a collections.Counter
    by_load: MutableMapping[tuple[str, int, str], int],
    served: Settled,
    code: str,
    started: float,
    now: float,
    routes: Mapping[str, Any],
) -> None:
    """An answer counted for its tenant: its code, and, for a streamed one served, that its
    first token (`@timed`) and its time per output token (`@itl_timed`) were timed and
    whether each came past its route's SLO (`@slow_ttft`, `@slow_itl`: a rollout's latency
    checks leave out the tenant with the most), and whether it waited on another tenant's
    load (`@crowded...`: left out). And the same per model by the load it met (`by_load`:
    model, band, "ttft_timed" ...), but for one crowded: a rollout compares like loads."""
    model, tenant = served.model, served.tenant
    counts[model, tenant, code] += 1
    if served.first_at is None or code != "ok":
        return
    route = routes.get(model)
    ttft_slo, itl_slo = (route.slo_ttft_s, route.slo_itl_s) if route is not None else (None, None)
    tokens = served.completion_tokens or 0
    tpot = (now - served.first_at) / (tokens - 1) if tokens > 1 else None
    band = load_band(served.load)
    for timed, slo, names, kind in ((served.first_at - started, ttft_slo, TTFT_CODES, "ttft"),
                                    (tpot, itl_slo, ITL_CODES, "itl")):  # fmt: skip
        if timed is None:
            continue
        slow = slo is not None and timed > slo
        counts[model, tenant, names[0]] += 1
        if slow:
            counts[model, tenant, names[1]] += 1
        if served.crowded:  # what it met was another tenant's load: a rollout leaves it out
            counts[model, tenant, names[2]] += 1
            if slow:
                counts[model, tenant, names[3]] += 1
            continue
        by_load[model, band, f"{kind}_timed"] += 1
        if slow:
            by_load[model, band, f"{kind}_slow"] += 1


def load_band(load: float) -> int:
    """1, 2, 4, 8, ...: the least power of two at or over `load`."""
    return 1 if load <= 1 else 1 << math.ceil(math.log2(load))
