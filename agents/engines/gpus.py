"""The node's GPUs: from NVML where a driver is present, else what the snapshot declares for
simulated nodes, else none."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pynvml

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Gpu:
    index: int
    model: str
    memory_gb: int
    source: str  # nvml | declared


@dataclass(frozen=True)
class GpuMemory:
    index: int
    used_gb: float
    total_gb: float


def discover() -> list[Gpu] | None:
    """The GPUs NVML sees, or None when there is no NVML (no driver, no GPU)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        log.info("no NVML here (%s): no physical GPUs", error)
        return None
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            model = name.decode() if isinstance(name, bytes) else str(name)
            found.append(Gpu(index, model, round(int(total) / 2**30), "nvml"))
        return found
    finally:
        pynvml.nvmlShutdown()


def simulated(spec: str | None) -> list[Gpu]:
    """The GPUs `COUNTxMODEL:MEMORY_GB` names (AgentSettings.simulated_gpus); none for None."""
    if spec is None:
        return []
    count, _, rest = spec.partition("x")
    model, _, memory_gb = rest.rpartition(":")
    return [Gpu(index, model, int(memory_gb), "declared") for index in range(int(count))]


def memory() -> list[GpuMemory]:
    """Used and total memory of each NVML GPU; empty without NVML."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        out = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
            out.append(GpuMemory(index, int(info.used) / 2**30, int(info.total) / 2**30))
        return out
    finally:
        pynvml.nvmlShutdown()
