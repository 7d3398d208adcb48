"""What a heartbeat tells the control plane: engine states and loads, GPU memory, what the
engines served since the last heartbeat (request rate, prefix-cache hit rate, TTFT and ITL
percentiles) from their own metrics, and what the gateway answered per model, refusals and
errors by their code too."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from google.protobuf.timestamp_pb2 import Timestamp
from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents.books import Books
from agents.engines import gpus
from agents.engines.metrics import Counters, quantile
from agents.engines.runner import EngineRunner
from agents.gateway.receipts import Receipt
from agents.metrics import Bucketed
from agents.quality.guard import Event
from agents.quality.runtime import Quality


class TelemetryWindow:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[str, Counters] = {}
        self._answered: dict[tuple[str, str], int] = {}
        self._at: float | None = None

    def report(
        self,
        runners: Iterable[EngineRunner],
        gpu_list: Iterable[gpus.Gpu],
        memory: Iterable[gpus.GpuMemory],
        counters: Mapping[str, Counters] | None = None,
        books: Books | None = None,
        receipts: Iterable[Receipt] = (),
        breakers: Mapping[str, str] | None = None,
        latency: Mapping[str, Mapping[str, Bucketed]] | None = None,
    ) -> pb.Telemetry:
        """`memory` is NVML's reading, taken off the event loop by the caller; `counters`, the
        engines' own metrics now, by engine id; `books`, what
        the agent counted since it started (the gateway's answers by model and code, those a
        peer answered, the escalations); `latency`, the TTFT and ITL histograms by model."""
        runners = list(runners)
        books = books if books is not None else Books()
        served, seconds = self._since_last(counters or {})
        escalations = [(d, p, r, n) for (d, p, r), n in sorted(books.escalations.items())]
        answers = self._answers(dict(books.answered), seconds, books.escalated, latency or {},
                                books.received)  # fmt: skip
        now = Timestamp()
        now.GetCurrentTime()
        engines = [
            pb.EngineStatus(
                id=r.spec.id,
                deployment=r.spec.deployment,
                model=r.spec.model,
                state=str(r.state),
                inflight_requests=r.load.running,
                queued_requests=r.load.waiting,
                restarts=r.restarts,
                reason=r.reason[:500],
                breaker=(breakers or {}).get(r.spec.id, ""),
                ready_after_s=r.ready_after_s,
            )
            for r in runners
        ]
        used = {m.index: m.used_gb for m in memory}
        return pb.Telemetry(
            observed_at=now,
            engines=engines,
            gpus=[
                pb.GpuMemory(index=g.index, used_gb=used.get(g.index, 0.0), total_gb=g.memory_gb)
                for g in gpu_list
            ],
            inflight_requests=sum(e.inflight_requests for e in engines),
            queued_requests=sum(e.queued_requests for e in engines),
            prefix_cache_hit_rate=(
                served.cached_tokens / served.prompt_tokens if served.prompt_tokens else 0.0
            ),
            ttft_ms=_percentiles(served.ttft),
            itl_ms=_percentiles(served.itl),
            requests_per_second=served.requests / seconds if seconds > 0 else 0.0,
            escalations=[
                pb.EscalationCount(direction=d, peer=p, reason=r, count=n)
                for d, p, r, n in escalations
            ],
            escalations_in=sum(n for d, _, _, n in escalations if d == "in"),
            escalations_out=sum(n for d, _, _, n in escalations if d == "out"),
            receipts=[_receipt(r) for r in receipts],
            answers=answers,
        )

    def _answers(
        self,
        answered: dict[tuple[str, str], int],
        seconds: float,
        escalated: Mapping[str, int],
        latency: Mapping[str, Mapping[str, Bucketed]],
        received: Mapping[tuple[str, str], int],
    ) -> list[pb.ModelAnswers]:
        before, self._answered = self._answered, answered
        rates: dict[str, dict[str, float]] = {}
        totals: dict[str, dict[str, int]] = {}
        from_peers: dict[str, dict[str, int]] = {}
        for (model, code), count in received.items():
            from_peers.setdefault(model, {})[code] = count
        for (model, code), count in answered.items():
            totals.setdefault(model, {})[code] = count
            new = count - before.get((model, code), 0)
            if new > 0 and seconds > 0:
                rates.setdefault(model, {})[code] = new / seconds
        out = []
        for model in sorted({*totals, *escalated, *latency}):
            codes, histograms = rates.get(model, {}), latency.get(model, {})
            out.append(
                pb.ModelAnswers(
                    model=model,
                    per_second=sum(codes.values()),
                    per_second_by_code=codes,
                    total_by_code=totals.get(model, {}),
                    escalated_total=escalated.get(model, 0),
                    ttft=_histogram(histograms.get("ttft", [])),
                    itl=_histogram(histograms.get("itl", [])),
                    received_by_code=from_peers.get(model, {}),
                )
            )
        return out

    def _since_last(self, counters: Mapping[str, Counters]) -> tuple[Counters, float]:
        """Summed over the engines; an engine seen for the first time adds nothing yet."""
        now = self._clock()
        total = Counters()
        for engine_id, now_counted in counters.items():
            before = self._last.get(engine_id)
            if before is not None:
                total = total.plus(now_counted.minus(before))
        seconds = now - self._at if self._at is not None else 0.0
        self._last, self._at = dict(counters), now
        return total, seconds


def _histogram(buckets: Bucketed) -> pb.Histogram:
    return pb.Histogram(le=[le for le, _ in buckets], count=[n for _, n in buckets])


def _percentiles(buckets: dict[float, float]) -> pb.Percentiles:
    return pb.Percentiles(
        p50=quantile(buckets, 0.5) * 1000,
        p90=quantile(buckets, 0.9) * 1000,
        p99=quantile(buckets, 0.99) * 1000,
    )


def _receipt(r: Receipt) -> pb.RouteReceipt:
    at = Timestamp()
    at.FromNanoseconds(int(r.at * 1e9))
    return pb.RouteReceipt(
        at=at, request_id=r.request_id, model=r.model, tenant=r.tenant, status=r.status,
        served_by=r.served_by, policy=r.policy, reason=r.reason[:300], came_from=r.came_from,
        ttft_ms=r.ttft_ms or 0.0, duration_ms=r.duration_ms,
    )  # fmt: skip


def add_quality(telemetry: pb.Telemetry, quality: Quality) -> None:
    """The quality guard's events since the last heartbeat, the workers it holds, and the
    region's figures per model."""
    telemetry.quality_events.extend(_quality_event(e) for e in quality.take_unsent())
    telemetry.quality_held.extend(_quality_event(e) for e in quality.held().values())
    for model, doc in quality.models().items():
        telemetry.quality.append(pb.ModelQuality(
            model=model, answers=doc["answers"], flagged=doc["flagged"],
            canaries=[pb.CanaryScore(**c) for c in doc["canaries"]],
        ))  # fmt: skip


TENANTS_TOLD = 16  # per model: the tenants with the most answers that were not "ok"


def add_tenant_answers(telemetry: pb.Telemetry, books: Books) -> None:
    """Per model, the tenants with the most answers that were not "ok" (or came past the
    SLO), then those with the most answers, since the start: their answers, and those by
    code (with `@timed`, `@slow_ttft` and the rest of agents/metrics.py's TTFT_CODES and
    ITL_CODES), and whether that is every tenant with answers; and the model's timed
    answers by the load they met.

    A tenant is told from its first answer while there is room, not from its first refusal:
    a reader takes the difference of two heartbeats as what happened between them, and a
    tenant told for the first time with all its answers since the start would count them
    all in that window."""
    models: dict[str, dict[str, dict[str, int]]] = {}  # model: tenant: code: count
    for (model, tenant, code), count in books.by_tenant.items():
        models.setdefault(model, {}).setdefault(tenant, {})[code] = count
    bands: dict[str, dict[int, dict[str, int]]] = {}  # model: band: what: count
    for (model, band, what), count in books.by_load.items():
        bands.setdefault(model, {}).setdefault(band, {})[what] = count
    for answers in telemetry.answers:
        met = sorted(bands.get(answers.model, {}).items())
        answers.bands.extend(pb.LoadBand(band=b, **counts) for b, counts in met)
        tenants = models.get(answers.model, {})
        bad = {t: sum(n for c, n in codes.items() if c not in ("ok", "@timed", "@itl_timed"))
               for t, codes in tenants.items()}  # fmt: skip
        total = {t: sum(n for c, n in codes.items() if not c.startswith("@"))
                 for t, codes in tenants.items()}  # fmt: skip
        ranked = sorted(tenants, key=lambda t: (-bad[t], -total[t], t))
        answers.tenants_all = len(ranked) <= TENANTS_TOLD
        for tenant in ranked[:TENANTS_TOLD]:
            codes = tenants[tenant]
            answers.tenants.append(pb.TenantAnswers(
                tenant=tenant, total=total[tenant],
                by_code={c: n for c, n in codes.items() if c != "ok"},
            ))  # fmt: skip


def add_classes(
    telemetry: pb.Telemetry, books: Books, waits: Mapping[tuple[str, str], Bucketed]
) -> None:
    """Per model and service class, since the start: its requests by outcome, and the
    waits of those admitted."""
    classes: dict[str, dict[str, dict[str, int]]] = {}  # model: class: outcome: count
    for (model, service_class, outcome), count in books.classes.items():
        classes.setdefault(model, {}).setdefault(service_class, {})[outcome] = count
    for model, service_class in waits:
        classes.setdefault(model, {}).setdefault(service_class, {})
    for answers in telemetry.answers:
        for service_class, outcomes in sorted(classes.pop(answers.model, {}).items()):
            answers.classes.append(pb.ClassAnswers(
                service_class=service_class, by_outcome=outcomes,
                wait=_histogram(waits.get((answers.model, service_class), [])),
            ))  # fmt: skip


def add_tiers(telemetry: pb.Telemetry, books: Books) -> None:
    """The tiered routes' counts since the agent started."""
    telemetry.tiers.extend(
        pb.TierCount(route=r, kind="answered", model=m, why=w, count=n)
        for (r, m, w), n in sorted(books.tier_answered.items())
    )
    telemetry.tiers.extend(
        pb.TierCount(route=r, kind="moved", model=to, from_model=came, why=w, count=n)
        for (r, came, to, w), n in sorted(books.tier_moves.items())
    )
    telemetry.tiers.extend(
        pb.TierCount(route=r, kind="cascade", why=signal, count=n)
        for (r, signal), n in sorted(books.cascades.items())
    )


def _quality_event(event: Event) -> pb.QualityEvent:
    at = Timestamp()
    at.FromNanoseconds(int(event.at * 1e9))
    return pb.QualityEvent(
        kind=event.kind, worker=event.worker, model=event.model, check=event.check,
        figure=event.figure, peers_figure=event.peers_figure, examples=event.examples, at=at,
    )  # fmt: skip
