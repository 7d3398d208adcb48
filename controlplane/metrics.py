"""The control plane's Prometheus metrics (`GET /metrics`, viewer and above): its API's latency
(OpenTelemetry's `http.server.request.duration`, as a Prometheus name, by method, route
template and status), the agents connected to this replica per region, the snapshot acks
and nacks they sent, the push lag: from a snapshot's send to its agent's ack, the snapshots
and deltas sent and their bytes, the compiles and the time they took (of it, reading
PostgreSQL); and, on the leader, rollouts by outcome, rollbacks by check and the time each
wave took, and the capacity planner's engines, forecasts, costs and changes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry.trace import SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.requests import Request
from starlette.responses import Response

HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
PUSH_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
WAVE_BUCKETS = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PROPAGATOR = TraceContextTextMapPropagator()


class ControlPlaneMetrics:
    def __init__(self, tracer: Tracer | None = None) -> None:
        self.tracer = tracer
        self.registry = r = CollectorRegistry(auto_describe=False)
        self.api = Histogram(
            "http_server_request_duration", "Duration of the admin API's requests",
            ["http_request_method", "http_route", "http_response_status_code"],
            unit="seconds", buckets=HTTP_BUCKETS, registry=r,
        )  # fmt: skip
        self.connected = Gauge("meridian_agents_connected", "Agents holding a stream to this "
                               "replica", ["region"], registry=r)  # fmt: skip
        self.acks = Counter("meridian_snapshot_acks", "Snapshots agents applied", ["region"],
                            registry=r)  # fmt: skip
        self.nacks = Counter("meridian_snapshot_nacks", "Snapshots agents refused", ["region"],
                             registry=r)  # fmt: skip
        self.usage_stored = Counter("meridian_usage_records_stored", "Usage records stored "
                                    "(each once, however often sent)", ["region"],
                                    registry=r)  # fmt: skip
        self.usage_failed = Counter("meridian_usage_batches_failed", "Batches of usage records "
                                    "that could not be stored (sent again)", ["region"],
                                    registry=r)  # fmt: skip
        self.usage_drift = Gauge("meridian_usage_drift_ratio", "The usage ledger's tokens less "
                                 "an engine's own count, a part of the engine's (the leader's "
                                 "last reconciliation)", ["worker", "tokens"],
                                 registry=r)  # fmt: skip
        self.budget_spent = Gauge("meridian_budget_spent_ratio", "A spend budget's window: "
                                  "its part spent and held, 0 to 1", ["tenant", "budget"],
                                  registry=r)  # fmt: skip
        self.budget_alerts = Counter("meridian_budget_alerts", "Spend budgets' soft thresholds "
                                     "passed (once a window)", ["tenant", "budget"],
                                     registry=r)  # fmt: skip
        self.push_lag = Histogram("meridian_push_ack", "From a snapshot's send to its agent's "
                                  "ack", ["region"], unit="seconds", buckets=PUSH_BUCKETS,
                                  registry=r)  # fmt: skip
        self.pushed = Counter("meridian_snapshots_sent", "Snapshots sent to agents, whole "
                              "(`full`) or as a delta from what they held (`delta`)", ["kind"],
                              registry=r)  # fmt: skip
        self.pushed_bytes = Counter("meridian_snapshot_sent_bytes", "Bytes of the snapshots "
                                    "sent", ["kind"], registry=r)  # fmt: skip
        self.resyncs = Counter("meridian_snapshot_resyncs", "Deltas agents could not apply, "
                               "answered with the whole snapshot", ["region"],
                               registry=r)  # fmt: skip
        self.compiles = Counter("meridian_compile_seconds", "Time spent reading and compiling "
                                "revisions, by phase (`read`: PostgreSQL)", ["phase"],
                                registry=r)  # fmt: skip
        self.rollouts = Counter("meridian_rollouts", "Rollouts ended, by outcome", ["outcome"],
                                registry=r)  # fmt: skip
        self.rollbacks = Counter("meridian_rollbacks", "Rollbacks, by the check that failed",
                                 ["check"], registry=r)  # fmt: skip
        self.planned = Gauge("meridian_planner_engines", "Engines of a deployment with "
                             "autoscale: running by the plan (`now`) and planned next",
                             ["deployment", "region", "model", "kind"], registry=r)  # fmt: skip
        self.forecast = Gauge("meridian_planner_forecast_rps", "The requests a second the "
                              "planner expects one start time ahead",
                              ["deployment", "region", "model"], registry=r)  # fmt: skip
        self.cost = Gauge("meridian_planner_cost_per_hour", "What the planned engines cost an "
                          "hour, at the region's cheapest node pool's price",
                          ["deployment", "region", "model"], registry=r)  # fmt: skip
        self.plan_changes = Counter("meridian_planner_changes", "Changes the planner decided, "
                                    "up or down, made (`taken`) or not", ["direction", "taken"],
                                    registry=r)  # fmt: skip
        self.batch_lines = Counter("meridian_batch_lines", "Batches' lines the leader's runner "
                                   "sent, by region and what came of them (answered, refused "
                                   "for room, failed, unreachable)", ["region", "outcome"],
                                   registry=r)  # fmt: skip
        self.batch_backlog = Gauge("meridian_batch_backlog", "Batches' lines not answered yet, "
                                   "pending or running (the leader's)", ["state"],
                                   registry=r)  # fmt: skip
        self.waves = Histogram("meridian_rollout_wave", "How long a rollout's wave took, from "
                               "its push to the next wave's", unit="seconds",
                               buckets=WAVE_BUCKETS, registry=r)  # fmt: skip

    def planner(self, decisions: list[dict[str, Any]]) -> None:
        """The capacity planner's period: per deployment, engines now and planned, the
        forecast and the planned cost an hour; each change counted, made or not."""
        for gauge in (self.planned, self.forecast, self.cost):
            gauge.clear()
        for d in decisions:
            labels = (d["deployment"], d["region"], d["model"])
            self.planned.labels(*labels, "now").set(d["engines"])
            self.planned.labels(*labels, "planned").set(d["target"])
            self.forecast.labels(*labels).set(d["forecast_rps"])
            self.cost.labels(*labels).set(d.get("cost_per_hour") or 0.0)
            if d["target"] != d["engines"]:
                direction = "up" if d["target"] > d["engines"] else "down"
                self.plan_changes.labels(direction, "true" if d["taken"] else "false").inc()

    def batch_line(self, region: str, outcome: str) -> None:
        self.batch_lines.labels(region, outcome).inc()

    def backlog(self, states: dict[str, int]) -> None:
        for state in ("pending", "running"):
            self.batch_backlog.labels(state).set(states.get(state, 0))

    def drift(self, found: list[dict[str, Any]]) -> None:
        """The leader's last reconciliation: each engine's drift, prompt and completion."""
        self.usage_drift.clear()
        for f in found:
            for tokens, drift in f["drift"].items():
                self.usage_drift.labels(f["worker"], tokens).set(drift)

    def budget(self, tenant: str, budget: str, spent: float, alerted: bool) -> None:
        """A spend budget's window at the leader's period: its part spent and held (0 to 1),
        and its soft threshold passed."""
        self.budget_spent.labels(tenant, budget).set(spent)
        if alerted:
            self.budget_alerts.labels(tenant, budget).inc()

    def rollout(self, event: str, detail: dict[str, Any]) -> None:
        """What the rollout driver saw: an outcome, a rollback's check, a wave's time."""
        if event == "outcome":
            self.rollouts.labels(detail["outcome"]).inc()
        elif event == "rollback":
            self.rollbacks.labels(detail["check"]).inc()
        elif event == "wave":
            self.waves.observe(detail["seconds"])

    async def render(self) -> bytes:
        return await asyncio.to_thread(generate_latest, self.registry)

    async def timed(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        """HTTP middleware: each request's duration by its route's template, and with a
        tracer, its server span (a child of the caller's W3C context)."""
        started = time.perf_counter()
        span = None
        if self.tracer is not None:
            parent = PROPAGATOR.extract(dict(request.headers))
            span = self.tracer.start_span(request.method, parent, SpanKind.SERVER)
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            route = _route(request)
            self.api.labels(request.method, route, str(status)).observe(
                time.perf_counter() - started
            )
            if span is not None:
                span.update_name(f"{request.method} {route}")
                span.set_attributes(
                    {
                        "http.request.method": request.method,
                        "http.route": route,
                        "http.response.status_code": status,
                    }
                )
                span.end()


def _route(request: Request) -> str:
    """The route template (`/v1/regions/{name}`) the router matched, never the raw path
    (which would make labels without bound)."""
    route = request.scope.get("route")
    return str(getattr(route, "path", "unmatched"))
