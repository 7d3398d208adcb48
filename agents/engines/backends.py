"""The three backends: SGLang's launch_server, the simulator, and an external URL."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agents.engines import sglang_env
from agents.engines.base import Backend, EngineSpec, Launch, check_owned, flags, gpu_env
from agents.engines.contract import DEFAULT_PRIORITY, PRIORITY_POLICIES
from agents.engines.sim import tokens as sim_tokens
from agents.engines.sim.cli import sim_command
from agents.engines.sim.config import SUFFIX as SIM_SUFFIX
from agents.engines.tokenizers import HfTokenizer, PromptTokenizer
from agents.errors import SnapshotInvalid

CPU_LORA_BACKEND = "torch_native"  # the one LoRA backend of SGLang's with no GPU kernel
CPU_KV_TOKENS = 65536  # SGLang's KV pool on a CPU node, unless engine_args set one (left
# unbounded, it takes most of the machine's memory: 14.7 GB for the tiny model)


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
    out += priority_flags(spec.args)
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


def priority_flags(args: Mapping[str, Any]) -> list[str]:
    """The engine takes requests by their class (agents/engines/contract.py), unless its
    engine_args choose a schedule policy priorities do not work with."""
    if str(args.get("schedule-policy", "fcfs")) not in PRIORITY_POLICIES:
        return []
    return ["--enable-priority-scheduling", "--default-priority-value", str(DEFAULT_PRIORITY)]


def _pd_flags(spec: EngineSpec) -> list[str]:
    if spec.role == "unified":
        return []
    out = ["--disaggregation-mode", spec.role]
    if spec.role == "prefill" and spec.bootstrap_port is not None:
        out += ["--disaggregation-bootstrap-port", str(spec.bootstrap_port)]
    return out


class SglangBackend(Backend):
    """`python -m sglang.launch_server` with the deployment's settings, pinned to its GPUs.

    `python` is SGLang's own interpreter (its environment, never Meridian's). On a node
    without GPUs (`cpu`), the engine runs on the CPU: `--device cpu`, SGLang's CPU engine, a
    bounded KV pool, and, where the real `sgl_kernel` does not load (the PyPI wheel is
    CUDA-only), Meridian's stand-in, which makes SGLang take its pure-torch paths. Each is
    said in the engine's status (`notes`).
    """

    name = "sglang"

    def __init__(self, python: str | None = None, *, cpu: bool = False) -> None:
        self.python = python or sglang_env.default_python()
        self.cpu = cpu
        self._kernel: sglang_env.KernelCheck | None = None
        self._kernel_lock = threading.Lock()

    def validate(self, spec: EngineSpec) -> None:
        check_owned(spec)
        if self.cpu:
            if spec.tp_size * spec.dp_size != 1 or spec.role != "unified":
                raise SnapshotInvalid(
                    f"engine {spec.id}: this node has no GPUs, so SGLang runs on its CPU, as "
                    f"one unified engine (tp 1, dp 1); it asks for {spec.role}, tp "
                    f"{spec.tp_size} x dp {spec.dp_size}"
                )
            return
        if len(spec.gpu_indexes) != spec.tp_size * spec.dp_size:
            raise SnapshotInvalid(
                f"engine {spec.id}: tp {spec.tp_size} x dp {spec.dp_size} needs "
                f"{spec.tp_size * spec.dp_size} GPUs, the plan gives {len(spec.gpu_indexes)}"
            )

    def launch(self, spec: EngineSpec) -> Launch:
        """Blocking on a CPU node's first launch (it imports sgl_kernel once to see whether
        the real one loads): call it off the event loop."""
        argv = [self.python, "-m", "sglang.launch_server", "--model-path", spec.model_source]
        argv += _served_flags(spec)
        argv += flags(spec.args)
        if not self.cpu:
            return Launch(argv, gpu_env(spec))
        argv += ["--device", "cpu"]
        if "max-total-tokens" not in spec.args:
            argv += ["--max-total-tokens", str(CPU_KV_TOKENS)]
        env = dict(sglang_env.CPU_ENV)
        notes = ["cpu: no GPU on this node; SGLang runs on the CPU (--device cpu)"]
        paths: list[str] = []
        kernel = self._kernel_check()
        if not kernel.loads:
            paths.append(str(sglang_env.CPU_KERNEL_DIR))
            notes.append(
                "sgl_kernel: Meridian's CPU stand-in (no kernels; SGLang's pure-torch "
                f"paths), since the real one does not load here: {kernel.reason}"
            )
        if spec.args.get("enable-lora"):
            if "lora-backend" not in spec.args:
                argv += ["--lora-backend", CPU_LORA_BACKEND]
            paths.append(str(sglang_env.CPU_LORA_DIR))
            notes.append(
                f"lora: SGLang's {spec.args.get('lora-backend', CPU_LORA_BACKEND)} LoRA "
                "backend, its pinned memory plain memory (no CUDA to pin for)"
            )
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(paths)
        return Launch(argv, env, tuple(notes))

    def _kernel_check(self) -> sglang_env.KernelCheck:
        with self._kernel_lock:
            if self._kernel is None:
                self._kernel = sglang_env.check_kernel(self.python)
            return self._kernel


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
        """A model source that is a local model directory (the tiny model) is the
        simulator's tokenizer too, so that it counts tokens as SGLang serving it does."""
        argv = [self.python, "-m", "meridian", "sim", *_served_flags(spec), *flags(spec.args)]
        source = Path(spec.model_source) if spec.model_source else None
        if source is not None and (source / "tokenizer.json").is_file():
            argv += ["--model-path", str(source)]
        return Launch(argv, gpu_env(spec))


class ExternalBackend(Backend):
    """An SGLang endpoint someone else runs: probed, never launched."""

    name = "external"
    launched = False

    def launch(self, spec: EngineSpec) -> Launch:
        raise SnapshotInvalid(f"engine {spec.id}: external engines are never launched")


class SimTokenizer:
    """The simulator's shipped model counts tokens its own way (words its vocabulary lacks get
    stable hashed ids)."""

    def chat(self, messages: list[Any]) -> list[int]:
        return sim_tokens.encode(sim_tokens.chat_prompt(messages))

    def text(self, text: str) -> list[int]:
        return sim_tokens.encode(text)


def tokenizer(tokenizer_path: str | None, version: str) -> PromptTokenizer | None:
    """The tokenizer an engine uses, by what it says of itself (`/server_info`), or None when
    it cannot be had here (the router then matches prompts approximately): the simulator's
    own for a simulator with its shipped model; else the Hugging Face directory the engine
    names, as SGLang loads it (a simulator given another model counts with that one's, as
    SGLang does). Reads files: call it off the event loop."""
    simulated = version.endswith(SIM_SUFFIX)
    if simulated and (tokenizer_path is None or sim_tokens.bundled(tokenizer_path)):
        return SimTokenizer()
    if not tokenizer_path or not (Path(tokenizer_path) / "tokenizer.json").is_file():
        return None
    return HfTokenizer(Path(tokenizer_path))


def backends(*, cpu: bool = False, sglang_python: str | None = None) -> dict[str, Backend]:
    """`cpu`: the node has no GPUs (SGLang runs on its CPU)."""
    sglang = SglangBackend(sglang_python, cpu=cpu)
    return {b.name: b for b in (sglang, SimBackend(), ExternalBackend())}
