"""A small fleet that tests build on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from controlplane.snapshot import FleetState

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"

BASE: dict[str, Any] = {
    "clouds": [{"name": "aws", "provider": "aws"}, {"name": "gcp", "provider": "gcp"}],
    "regions": [
        {
            "name": "us-east",
            "cloud": "aws",
            "geography": "us-east",
            "jurisdiction": "us",
            "gateway_url": "http://10.0.0.1:8500",
        },
        {
            "name": "eu-west",
            "cloud": "gcp",
            "geography": "eu-west",
            "jurisdiction": "eu",
            "gateway_url": "http://10.0.1.1:8500",
        },
    ],
    "models": [
        {
            "name": "llama-8b",
            "source": "meta-llama/Llama-3.1-8B-Instruct",
            "context_length": 8192,
            "min_gpu_memory_gb": 24,
        }
    ],
    "tenants": [{"name": "acme", "tier": "standard"}],
}


def example(
    *, rollouts: bool = False, groups: bool = False, adapters: bool = False
) -> dict[str, Any]:
    """examples/fleet.yaml; without its rollout policy unless asked for, so that the test
    database's `strategy: immediate` stands (see tests/conftest.py); without its pools'
    cloud groups unless asked for, so that no planner asks a real cloud for them; without
    its LoRA adapter unless asked for (its files are not on this machine, and the leader's
    plan for it would make revisions the tests do not expect)."""
    loaded: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    if not adapters:
        del loaded["adapters"]
    if not rollouts:
        del loaded["rollout_policies"]
    if not groups:
        for pool in loaded["node_pools"]:
            pool.pop("group", None)
    return loaded


def state_from(document: dict[str, Any], revision: int = 7, **extra: Any) -> FleetState:
    state: dict[str, Any] = {"revision": revision, **extra}
    for key, items in document.items():
        if key != "apiVersion":
            state[key] = {
                item["name"]: {k: v for k, v in item.items() if k != "name"} for item in items
            }
    return FleetState.model_validate(state)
