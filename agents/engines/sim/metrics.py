"""The simulator's Prometheus metrics, under SGLang's names and labels (`sglang:` prefix)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from agents.engines.sim.engine import Engine
from agents.engines.sim.request import Observer, Request

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1, 2, 4, 6, 8, 10, 20, 40, 60)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.06, 0.08,
               0.1, 0.2, 0.4, 0.8, 1, 2)  # fmt: skip
TRANSFER_MS_BUCKETS = (1, 5, 10, 50, 100, 500, 1000, 5000)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 6, 8, 10, 20, 40, 60, 120, 300)


class Metrics(Observer):
    """Counters and histograms observed as requests go; gauges read from the engine on scrape.

    Names and labels as SGLang 0.5.23 has them: the tokenizer's series carry
    `{engine_type, is_streaming, model_name}` (`cached_tokens_total` `cache_source` instead of
    `is_streaming`; `inter_token_latency_seconds` and `num_aborted_requests_total` neither), the
    scheduler's `{engine_type, model_name, moe_ep_rank, pp_rank, tp_rank}`. With priority
    scheduling on, every one of them has a `priority` label too: the request's priority on the
    tokenizer's series, empty on the scheduler's, whose running and queued counts are broken
    down by priority besides."""

    def __init__(self, model_name: str, engine_type: str, priority: bool = False) -> None:
        self.registry = CollectorRegistry()
        self.engine: Engine | None = None
        self._by_priority = priority
        base = {"engine_type": engine_type, "model_name": model_name}
        if priority:
            base["priority"] = ""
        sched = {**base, "moe_ep_rank": "0", "pp_rank": "0", "tp_rank": "0"}
        self._base, self._sched = base, sched
        self._priorities: set[int] = set()  # those the counts are broken down by
        streaming = [*base, "is_streaming"]
        self._prompt = self._counter("prompt_tokens", "Prefill tokens processed", streaming)
        self._generation = self._counter("generation_tokens", "Generation tokens", streaming)
        self._cached = Counter("sglang:cached_tokens", "Prompt tokens from the prefix cache",
                               [*base, "cache_source"], registry=self.registry)  # fmt: skip
        self._requests = self._counter("num_requests", "Requests finished", streaming)
        self._aborted = self._counter("num_aborted_requests", "Requests aborted", list(base))
        self._ttft = self._histogram("time_to_first_token_seconds", TTFT_BUCKETS, streaming)
        self._itl = self._histogram("inter_token_latency_seconds", ITL_BUCKETS, list(base))
        self._tpot = self._histogram(
            "request_time_per_output_token_seconds", ITL_BUCKETS, streaming
        )
        self._e2e = self._histogram("e2e_request_latency_seconds", E2E_BUCKETS, streaming)
        self._queue = self._histogram("queue_time_seconds", E2E_BUCKETS, list(sched))
        self._prompt_total = 0
        self._cached_total = 0
        self.transfer_queue = 0  # PD decode: requests waiting for their KV cache
        self.prefill_inflight = 0  # PD prefill: prefilled, not yet fetched by a decode server
        self.last_transfer_ms = 0.0
        gauges: dict[str, Callable[[], float]] = {
            "num_running_reqs": lambda: len(self._engine().running),
            "num_queue_reqs": lambda: len(self._engine().waiting),
            "num_used_tokens": lambda: self._engine().used_tokens,
            "token_usage": self._token_usage,
            "gen_throughput": lambda: self._engine().stats.gen_throughput,
            "cache_hit_rate": lambda: self._cached_total / max(1, self._prompt_total),
            "max_total_num_tokens": lambda: self._engine().cost.max_total_tokens,
            "utilization": lambda: 1.0 if self._engine().running else 0.0,
            "kv_used_tokens": lambda: self._engine().held_tokens,
            "kv_available_tokens": lambda: self._engine().capacity - self._engine().held_tokens,
            "num_prefill_bootstrap_queue_reqs": lambda: 0,
            "num_prefill_inflight_queue_reqs": lambda: self.prefill_inflight,
            "num_decode_prealloc_queue_reqs": lambda: 0,
            "num_decode_transfer_queue_reqs": lambda: self.transfer_queue,
        }
        self._gauges: dict[str, Gauge] = {}
        for name, read in gauges.items():
            gauge = Gauge(f"sglang:{name}", name, list(sched), registry=self.registry)
            gauge.labels(**sched).set_function(read)
            self._gauges[name] = gauge
        self._transfer = (
            Histogram(
                "sglang:kv_transfer_latency_ms",
                "KV transfer latency",
                list(sched),
                buckets=TRANSFER_MS_BUCKETS,
                registry=self.registry,
            ).labels(**sched)
            if engine_type != "unified"
            else None
        )  # fmt: skip  (registered in PD mode only, as SGLang does)
        self.registry.register(_Retracted(self._engine, sched))
        # the simulator's own (no SGLang name): the seconds its steps took, a GPU's busy time
        busy = Gauge("meridian_sim_busy_seconds", "Seconds of steps run (the simulated GPU's "
                     "busy time)", registry=self.registry)  # fmt: skip
        busy.set_function(lambda: self._engine().busy_s)

    def _counter(self, name: str, doc: str, labels: list[str]) -> Counter:
        return Counter(f"sglang:{name}", doc, labels, registry=self.registry)

    def _histogram(self, name: str, buckets: tuple[float, ...], labels: list[str]) -> Histogram:
        return Histogram(f"sglang:{name}", name, labels, buckets=buckets, registry=self.registry)

    def _engine(self) -> Engine:
        assert self.engine is not None, "attach the engine before scraping"
        return self.engine

    def _token_usage(self) -> float:
        engine = self._engine()
        return engine.used_tokens / max(1, engine.cost.max_total_tokens)

    def _labels(self, request: Request) -> dict[str, str]:
        """The tokenizer's series' labels for `request`."""
        if not self._by_priority:
            return self._base
        return {**self._base, "priority": str(request.priority)}

    def _streaming(self, request: Request) -> dict[str, str]:
        return {**self._labels(request), "is_streaming": "true" if request.streaming else "false"}

    def _break_down(self, priority: int | None) -> None:
        """Running and queued requests counted for `priority` too, from the first seen."""
        if priority is None or not self._by_priority or priority in self._priorities:
            return
        self._priorities.add(priority)
        labels = {**self._sched, "priority": str(priority)}
        engine = self._engine()
        self._gauges["num_running_reqs"].labels(**labels).set_function(
            lambda: sum(1 for r in engine.running if r.priority == priority)
        )
        self._gauges["num_queue_reqs"].labels(**labels).set_function(
            lambda: sum(1 for r in engine.waiting if r.priority == priority)
        )

    def transferred(self, milliseconds: float) -> None:
        self.last_transfer_ms = milliseconds
        if self._transfer is not None:
            self._transfer.observe(milliseconds)

    def admitted(self, request: Request) -> None:
        assert request.admitted is not None
        self._break_down(request.priority)
        self._queue.labels(**self._sched).observe(request.admitted - request.arrived)
        self._prompt.labels(**self._streaming(request)).inc(len(request.prompt))
        self._cached.labels(**self._labels(request), cache_source="device").inc(request.cached)
        self._prompt_total += len(request.prompt)
        self._cached_total += request.cached

    def first_token(self, request: Request) -> None:
        assert request.first_token_at is not None
        self._ttft.labels(**self._streaming(request)).observe(
            request.first_token_at - request.arrived
        )

    def finished(self, request: Request) -> None:
        assert request.finished_at is not None
        labels = self._streaming(request)
        self._generation.labels(**labels).inc(request.generated)
        if request.finish == "abort":
            self._aborted.labels(**self._labels(request)).inc()
            return
        self._requests.labels(**labels).inc()
        self._e2e.labels(**labels).observe(request.finished_at - request.arrived)
        if request.first_token_at is not None and request.generated > 1:
            mean = (request.finished_at - request.first_token_at) / (request.generated - 1)
            self._itl.labels(**self._labels(request)).observe(mean)
            self._tpot.labels(**labels).observe(mean)

    def load(self, mode: str) -> dict[str, object]:
        """One DP rank's entry of `/v1/loads`, in SGLang 0.5.23's shape. Waiting prompts'
        uncached tokens are estimated as SGLang does when its queue was not prefix-matched
        (FCFS): each prompt at the recent cache miss rate; a prompt in chunked prefill counts
        what it has left."""
        engine = self._engine()
        hit = self._cached_total / max(1, self._prompt_total)
        chunked = engine.chunked
        uncached = sum(int(len(r.prompt) * (1.0 - hit)) for r in engine.waiting)
        if chunked is not None:
            uncached += len(chunked.prompt) - chunked.computed
        capacity = engine.cost.max_total_tokens
        running = len(engine.running)
        moments = engine.stats.decode_moments
        return {
            "timestamp": time.time(),
            "dp_rank": 0,
            "num_running_reqs": running,
            "num_waiting_reqs": len(engine.waiting),
            "num_waiting_uncached_tokens": uncached,
            "num_used_tokens": engine.used_tokens,
            "num_total_tokens": engine.held_tokens,
            "num_active_tokens": engine.used_tokens,
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": capacity,
            "max_running_requests": engine.max_running,
            "token_usage": round(engine.used_tokens / max(1, capacity), 4),
            "gen_throughput": round(engine.stats.gen_throughput, 2),
            "cache_hit_rate": round(hit, 4),
            "utilization": 1.0 if running else 0.0,
            "total_prefill_uncached_tokens": engine.stats.prefill_uncached_total,
            "total_prefill_busy_us": engine.stats.prefill_busy_us,
            "decode_moments": list(moments) if moments[0] else None,
            "memory": {"weight_gb": 0.0, "kv_cache_gb": 0.0, "graph_gb": 0.0,
                       "token_capacity": capacity},
            "disaggregation": {
                "mode": mode if mode != "unified" else "null",
                "prefill_bootstrap_queue_reqs": 0,
                "prefill_inflight_queue_reqs": self.prefill_inflight,
                "decode_prealloc_queue_reqs": 0,
                "decode_transfer_queue_reqs": self.transfer_queue,
                "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": 0.0,
                "kv_transfer_latency_ms": self.last_transfer_ms,
            },
            "queues": {"waiting": len(engine.waiting), "grammar": 0, "paused": 0,
                       "retracted": 0, "prealloc_ready": 0},
        }  # fmt: skip

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Retracted(Collector):
    """`sglang:num_retracted_requests_total`: requests retracted for want of KV room (not
    those preempted for a higher priority, as SGLang counts), read from the engine on
    scrape. Absent until the first retraction, as SGLang's (its metrics are multiprocess: a
    counter never incremented has no value to publish)."""

    def __init__(self, engine: Callable[[], Engine], labels: dict[str, str]) -> None:
        self._engine, self._labels = engine, labels

    def collect(self) -> Iterator[CounterMetricFamily]:
        total = self._engine().retracted_total
        if total == 0:
            return
        family = CounterMetricFamily(
            "sglang:num_retracted_requests", "Total number of retracted requests.",
            labels=list(self._labels),
        )  # fmt: skip
        family.add_metric(list(self._labels.values()), total)
        yield family
