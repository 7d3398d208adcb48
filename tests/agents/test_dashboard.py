"""The Grafana dashboard and scrape config in examples/ name only metrics that Meridian serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client.core import Metric

from agents.books import Books
from agents.metrics import RequestMetrics, state_families
from controlplane.metrics import ControlPlaneMetrics

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _served_names() -> set[str]:
    """Every sample name the agent and the control plane expose, labels or not."""
    families: list[Metric] = [*RequestMetrics(lambda: "r").registry.collect()]
    families += ControlPlaneMetrics().registry.collect()
    families += state_families(Books(), revision=1, applied_at=0.0, waiting={}, breakers=[])
    names = set()
    for family in families:
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}
        names |= {family.name + s for s in suffixes.get(family.type, [""])}
    return names


def test_every_query_of_the_dashboard_names_a_metric_that_is_served() -> None:
    dashboard = json.loads((EXAMPLES / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {
        m for e in exprs for m in re.findall(r"\b(?:meridian|gen_ai_server|http_server)_\w+", e)
    }
    assert used
    assert used <= _served_names(), used - _served_names()


def test_the_scrape_config_covers_the_local_fleet() -> None:
    config = yaml.safe_load((EXAMPLES / "prometheus.yml").read_text())
    fleet = yaml.safe_load((EXAMPLES / "fleet.yaml").read_text())
    targets = {t for job in config["scrape_configs"] for s in job["static_configs"]
               for t in s["targets"]}  # fmt: skip
    gateways = {r["gateway_url"].removeprefix("http://") for r in fleet["regions"]}
    assert gateways | {"127.0.0.1:8400"} <= targets
