"""The adapters' families of the agent's `/metrics`: per adapter, the engines of the region
that hold it, its requests here, and its loads (those a request waited for, and their time)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agents.adapters.keeper import AdapterKeeper


def adapter_families(keeper: AdapterKeeper) -> list[Metric]:
    engines = GaugeMetricFamily("meridian_adapter_engines", "Engines of the region holding "
                                "the LoRA adapter", labels=["adapter"])  # fmt: skip
    requests = CounterMetricFamily("meridian_adapter_requests", "Requests naming the adapter",
                                   labels=["adapter"])  # fmt: skip
    cold = CounterMetricFamily("meridian_adapter_cold_loads", "Loads of the adapter that a "
                               "request waited for", labels=["adapter"])  # fmt: skip
    cold_s = CounterMetricFamily("meridian_adapter_cold_load_seconds", "Their time, summed",
                                 labels=["adapter"])  # fmt: skip
    failed = CounterMetricFamily("meridian_adapter_load_failures", "Loads of the adapter that "
                                 "failed (its files, their digest, or the engine)",
                                 labels=["adapter"])  # fmt: skip
    for name, seen in keeper.status().items():
        engines.add_metric([name], len(seen["engines"]))  # type: ignore[arg-type]
        counts = keeper.counts[name]
        requests.add_metric([name], counts.requests)
        cold.add_metric([name], counts.cold_loads)
        cold_s.add_metric([name], counts.cold_load_s)
        failed.add_metric([name], counts.failures)
    return [engines, requests, cold, cold_s, failed]
