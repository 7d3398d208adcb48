"""One interface, three backends: what an engine is, and how a backend launches or finds it.

The supervisor sees only `EngineSpec` and `Backend`; it cannot tell SGLang from the
simulator from an endpoint someone else runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agents.errors import SnapshotInvalid

Scalar = str | int | float | bool


@dataclass(frozen=True)
class EngineSpec:
    """One engine the snapshot wants on this node (or, for `external`, in this region)."""

    id: str
    deployment: str
    model: str
    backend: str
    role: str  # unified | prefill | decode
    url: str
    host: str = "127.0.0.1"
    port: int = 0
    gpu_indexes: tuple[int, ...] = ()
    model_source: str = ""
    context_length: int = 0
    tp_size: int = 1
    dp_size: int = 1
    engine_args: tuple[tuple[str, Scalar], ...] = ()
    bootstrap_port: int | None = None  # a prefill engine's PD bootstrap port, from the snapshot
    kv_events_port: int | None = None  # where it publishes KV-cache events, from the snapshot
    # how long it may finish its requests when it is stopped; None: the agent's setting. A
    # change of it alone changes nothing that runs
    drain_timeout_s: float | None = field(default=None, compare=False)

    @property
    def args(self) -> dict[str, Scalar]:
        return dict(self.engine_args)


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # what an operator should know of how it runs (its status)


class Backend(ABC):
    name: str
    launched = True  # False: probed, never started or stopped

    @abstractmethod
    def launch(self, spec: EngineSpec) -> Launch:
        """The command line and environment of the engine's process."""

    def validate(self, spec: EngineSpec) -> None:  # noqa: B027 - most backends accept all
        """Raise SnapshotInvalid if this backend cannot run `spec`."""


# Flags Meridian sets itself; engine_args may not override them.
OWNED_FLAGS = frozenset({
    "model-path", "served-model-name", "host", "port", "tp-size", "tp", "dp-size", "dp",
    "disaggregation-mode", "disaggregation-bootstrap-port", "enable-metrics",
    "enable-cache-report", "kv-events-config", "enable-priority-scheduling",
    "default-priority-value", "schedule-low-priority-values-first",
})  # fmt: skip


def check_owned(spec: EngineSpec) -> None:
    taken = sorted(OWNED_FLAGS & set(spec.args))
    if taken:
        raise SnapshotInvalid(
            f"engine {spec.id}: engine_args may not set --{', --'.join(taken)}; Meridian sets them"
        )


def flags(args: Mapping[str, Any]) -> list[str]:
    """engine_args as flags: `true` is a bare flag, `false` is left out."""
    out: list[str] = []
    for key, value in sorted(args.items()):
        if value is True:
            out.append(f"--{key}")
        elif value is not False and value is not None:
            out += [f"--{key}", str(value)]
    return out


def gpu_env(spec: EngineSpec) -> dict[str, str]:
    """Pin the engine to its GPUs, numbered as NVML and nvidia-smi number them."""
    return {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in spec.gpu_indexes),
    }
