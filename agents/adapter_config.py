"""Tenants' LoRA adapters as the gateway reads them (issue 45): compiled from the snapshot
with the rest of the region's config (agents/config.py), checked once.

A request names an adapter in `model`, as `base_model:adapter` or as the adapter alone.
A tenant the adapter does not name is answered exactly as for a model that does not exist
(agents/gateway/arrival.py), so that another tenant's adapter is never revealed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.adapters import split_model

from agents.errors import SnapshotInvalid


@dataclass(frozen=True, slots=True)
class AdapterConfig:
    name: str
    base_model: str
    source: str
    digest: str | None
    rank: int
    tenants: frozenset[str]
    resident: int = 0  # engines of the region that keep it loaded, as the leader plans


def compile_adapters(
    snapshot: pb.Snapshot, models: Mapping[str, object]
) -> dict[str, AdapterConfig]:
    """The snapshot's adapters by name; SnapshotInvalid for one of a model not served here
    or with a model's name."""
    out = {}
    for a in snapshot.adapters:
        if a.base_model not in models or a.name in models or ":" in a.name:
            raise SnapshotInvalid(
                f"adapter {a.name}: its base model must be served here, and its name no model's"
            )
        out[a.name] = AdapterConfig(a.name, a.base_model, a.source, a.digest or None, a.rank,
                                    frozenset(a.tenants), a.resident_engines)  # fmt: skip
    return out


def named(adapters: Mapping[str, AdapterConfig], asked: str) -> AdapterConfig | None:
    """The adapter `asked` names (`base:adapter`, or the adapter alone), or None. Whether the
    tenant may use it is the caller's to check (`AdapterConfig.tenants`)."""
    base, adapter_name = split_model(asked)
    adapter = adapters.get(adapter_name if adapter_name is not None else asked)
    if adapter is None or (adapter_name is not None and base != adapter.base_model):
        return None
    return adapter
