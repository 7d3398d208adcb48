"""The three backends: SGLang's launch_server, the simulator, and an external URL."""

from __future__ import annotations

import json
import sys

from agents.engines.base import Backend, EngineSpec, Launch, check_owned, flags, gpu_env
from agents.engines.sim.cli import sim_command
from agents.errors import SnapshotInvalid


def _served_flags(spec: EngineSpec) -> list[str]:
    """What SGLang and the simulator are both told: name, address, parallelism, PD role."""
    out = [
        "--served-model-name", spec.model,
        "--host", spec.host,
        "--port", str(spec.port),
        "--tp-size", str(spec.tp_size),
        "--dp-size", str(spec.dp_size),
        "--enable-metrics",
        "--enable-cache-report",
    ]  # fmt: skip
    if spec.context_length and "context-length" not in spec.args:
        out += ["--context-length", str(spec.context_length)]
    if spec.kv_events_port is not None:
        config = {
            "publisher": "zmq",
            "endpoint": f"tcp://*:{spec.kv_events_port}",
            "topic": "kv-events",
        }
        out += ["--kv-events-config", json.dumps(config, separators=(",", ":"))]
    return out + _pd_flags(spec)


def _pd_flags(spec: EngineSpec) -> list[str]:
    if spec.role == "unified":
        return []
    out = ["--disaggregation-mode", spec.role]
    if spec.role == "prefill" and spec.bootstrap_port is not None:
        out += ["--disaggregation-bootstrap-port", str(spec.bootstrap_port)]
    return out


class SglangBackend(Backend):
    """`python -m sglang.launch_server` with the deployment's settings, pinned to its GPUs."""

    name = "sglang"

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python

    def validate(self, spec: EngineSpec) -> None:
        check_owned(spec)
        if len(spec.gpu_indexes) != spec.tp_size * spec.dp_size:
            raise SnapshotInvalid(
                f"engine {spec.id}: tp {spec.tp_size} x dp {spec.dp_size} needs "
                f"{spec.tp_size * spec.dp_size} GPUs, the plan gives {len(spec.gpu_indexes)}"
            )

    def launch(self, spec: EngineSpec) -> Launch:
        argv = [self.python, "-m", "sglang.launch_server", "--model-path", spec.model_source]
        argv += _served_flags(spec)
        argv += flags(spec.args)
        return Launch(argv, gpu_env(spec))


def _sim_flags() -> frozenset[str]:
    names: set[str] = set()
    for param in sim_command.params:
        names.update(opt.removeprefix("--") for opt in param.opts if opt.startswith("--"))
    return frozenset(names)


class SimBackend(Backend):
    """`meridian sim`, given the same settings an SGLang engine would get."""

    name = "sim"

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python
        self.known = _sim_flags()

    def validate(self, spec: EngineSpec) -> None:
        check_owned(spec)
        unknown = sorted(set(spec.args) - self.known)
        if unknown:
            raise SnapshotInvalid(
                f"engine {spec.id}: the sim backend has no flag --{', --'.join(unknown)}"
            )

    def launch(self, spec: EngineSpec) -> Launch:
        argv = [self.python, "-m", "meridian", "sim", *_served_flags(spec), *flags(spec.args)]
        return Launch(argv, gpu_env(spec))


class ExternalBackend(Backend):
    """An SGLang endpoint someone else runs: probed, never launched."""

    name = "external"
    launched = False

    def launch(self, spec: EngineSpec) -> Launch:
        raise SnapshotInvalid(f"engine {spec.id}: external engines are never launched")


def backends() -> dict[str, Backend]:
    return {b.name: b for b in (SglangBackend(), SimBackend(), ExternalBackend())}
