"""The simulator's Prometheus metrics, under SGLang's names and labels (`sglang:` prefix)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from agents.engines.sim.engine import Engine
from agents.engines.sim.request import Observer, Request

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1, 2, 4, 6, 8, 10, 20, 40, 60)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.06, 0.08,
               0.1, 0.2, 0.4, 0.8, 1, 2)  # fmt: skip
E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 6, 8, 10, 20, 40, 60, 120, 300)


class Metrics(Observer):
    """Counters and histograms observed as requests go; gauges read from the engine on scrape."""

    def __init__(self, model_name: str, engine_type: str) -> None:
        self.registry = CollectorRegistry()
        self.engine: Engine | None = None
        base = {"model_name": model_name}
        sched = {**base, "engine_type": engine_type, "tp_rank": "0", "pp_rank": "0"}
        self._base, self._sched = base, sched
        self._prompt = self._counter("prompt_tokens", "Prefill tokens processed")
        self._generation = self._counter("generation_tokens", "Generation tokens processed")
        self._cached = self._counter("cached_tokens", "Prompt tokens served from the prefix cache")
        self._requests = self._counter("num_requests", "Requests finished")
        self._aborted = self._counter("num_aborted_requests", "Requests aborted")
        self._ttft = self._histogram("time_to_first_token_seconds", TTFT_BUCKETS)
        self._itl = [
            self._histogram("inter_token_latency_seconds", ITL_BUCKETS),
            self._histogram("time_per_output_token_seconds", ITL_BUCKETS),  # older builds' name
        ]
        self._e2e = self._histogram("e2e_request_latency_seconds", E2E_BUCKETS)
        self._queue = self._histogram("queue_time_seconds", E2E_BUCKETS)
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
            "gen_throughput": lambda: self._engine().gen_throughput,
            "cache_hit_rate": lambda: self._cached_total / max(1, self._prompt_total),
            "max_total_num_tokens": lambda: self._engine().cost.max_total_tokens,
            "num_prefill_prealloc_queue_reqs": lambda: 0,
            "num_prefill_inflight_queue_reqs": lambda: self.prefill_inflight,
            "num_decode_prealloc_queue_reqs": lambda: 0,
            "num_decode_transfer_queue_reqs": lambda: self.transfer_queue,
            "kv_transfer_latency_ms": lambda: self.last_transfer_ms,
        }
        for name, read in gauges.items():
            gauge = Gauge(f"sglang:{name}", name, list(sched), registry=self.registry)
            gauge.labels(**sched).set_function(read)
        # the simulator's own (no SGLang name): the seconds its steps took, a GPU's busy time
        busy = Gauge("meridian_sim_busy_seconds", "Seconds of steps run (the simulated GPU's "
                     "busy time)", registry=self.registry)  # fmt: skip
        busy.set_function(lambda: self._engine().busy_s)

    def _counter(self, name: str, doc: str) -> Counter:
        counter = Counter(f"sglang:{name}", doc, list(self._base), registry=self.registry)
        return counter.labels(**self._base)

    def _histogram(self, name: str, buckets: tuple[float, ...]) -> Histogram:
        histogram = Histogram(
            f"sglang:{name}", name, list(self._base), buckets=buckets, registry=self.registry
        )
        return histogram.labels(**self._base)

    def _engine(self) -> Engine:
        assert self.engine is not None, "attach the engine before scraping"
        return self.engine

    def _token_usage(self) -> float:
        engine = self._engine()
        return engine.used_tokens / max(1, engine.cost.max_total_tokens)

    def admitted(self, request: Request) -> None:
        assert request.admitted is not None
        self._queue.observe(request.admitted - request.arrived)
        self._prompt.inc(len(request.prompt))
        self._cached.inc(request.cached)
        self._prompt_total += len(request.prompt)
        self._cached_total += request.cached

    def first_token(self, request: Request) -> None:
        assert request.first_token_at is not None
        self._ttft.observe(request.first_token_at - request.arrived)

    def finished(self, request: Request) -> None:
        assert request.finished_at is not None
        self._generation.inc(request.generated)
        if request.finish == "abort":
            self._aborted.inc()
            return
        self._requests.inc()
        self._e2e.observe(request.finished_at - request.arrived)
        if request.first_token_at is not None and request.generated > 1:
            mean = (request.finished_at - request.first_token_at) / (request.generated - 1)
            for histogram in self._itl:
                histogram.observe(mean)

    def render(self) -> bytes:
        return generate_latest(self.registry)
