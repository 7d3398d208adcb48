"""The launchers build the command lines SGLang documents.

The flags an orchestrator sets, as `sglang.launch_server` documents them (server_args.py,
read in November 2026); kept here so that the project's tests depend on the project alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agents.engines import sglang_env
from agents.engines.backends import CPU_KV_TOKENS, SglangBackend, SimBackend
from agents.engines.base import EngineSpec
from agents.engines.contract import DEFAULT_PRIORITY
from agents.errors import SnapshotInvalid

DOCUMENTED_FLAGS = frozenset({
    "--api-key", "--chunked-prefill-size", "--context-length", "--default-priority-value",
    "--device", "--enable-priority-scheduling",
    "--disaggregation-bootstrap-port", "--disaggregation-mode",
    "--disaggregation-transfer-backend", "--dp-size", "--enable-cache-report",
    "--enable-metrics", "--host", "--kv-events-config", "--max-running-requests",
    "--max-total-tokens", "--mem-fraction-static", "--model-path", "--port",
    "--schedule-policy", "--served-model-name", "--skip-server-warmup", "--tp-size",
    "--watchdog-timeout",
})  # fmt: skip


def documented_flags() -> set[str]:
    return set(DOCUMENTED_FLAGS)


def spec(**changes: object) -> EngineSpec:
    base = EngineSpec(
        id="llama/prefill-0",
        deployment="llama",
        model="llama-3.1-8b-instruct",
        backend="sglang",
        role="unified",
        url="http://10.0.0.5:30002",
        host="10.0.0.5",
        port=30002,
        gpu_indexes=(2, 3),
        model_source="meta-llama/Llama-3.1-8B-Instruct",
        context_length=131072,
        tp_size=2,
        dp_size=1,
        engine_args=(("mem-fraction-static", 0.85), ("max-running-requests", 64)),
    )
    return EngineSpec(**{**base.__dict__, **changes})


def flag_values(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, item in enumerate(argv):
        if item.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[item] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def test_sglang_argv_uses_only_documented_flags_with_the_deployment_settings() -> None:
    launch = SglangBackend(python="/usr/bin/python3").launch(spec())
    assert launch.argv[:3] == ["/usr/bin/python3", "-m", "sglang.launch_server"]
    flags = flag_values(launch.argv)
    assert set(flags) <= documented_flags(), set(flags) - documented_flags()
    assert flags["--model-path"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert flags["--served-model-name"] == "llama-3.1-8b-instruct"
    assert flags["--host"] == "10.0.0.5"
    assert flags["--port"] == "30002"
    assert flags["--tp-size"] == "2"
    assert flags["--dp-size"] == "1"
    assert flags["--mem-fraction-static"] == "0.85"
    assert flags["--max-running-requests"] == "64"
    assert flags["--context-length"] == "131072"
    assert "--enable-metrics" in flags
    assert "--enable-cache-report" in flags
    assert "--disaggregation-mode" not in flags
    assert "--enable-priority-scheduling" in flags  # requests are taken by their class
    assert flags["--default-priority-value"] == str(DEFAULT_PRIORITY)
    assert launch.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,3"}
    # a schedule policy priorities do not work with: none (SGLang would refuse to start)
    lpm = flag_values(SglangBackend().launch(spec(engine_args=(("schedule-policy", "lpm"),))).argv)
    assert "--enable-priority-scheduling" not in lpm


def test_sglang_argv_for_pd_roles_and_kv_events() -> None:
    backend = SglangBackend()
    # the ports are the snapshot's, whatever they are
    pd = spec(role="prefill", bootstrap_port=40002, kv_events_port=50002)
    prefill = flag_values(backend.launch(pd).argv)
    decode = flag_values(backend.launch(spec(role="decode")).argv)
    assert prefill["--disaggregation-mode"] == "prefill"
    assert prefill["--disaggregation-bootstrap-port"] == "40002"
    assert decode["--disaggregation-mode"] == "decode"
    assert "--disaggregation-bootstrap-port" not in decode
    events = json.loads(prefill["--kv-events-config"] or "")
    assert events == {"publisher": "zmq", "endpoint": "tcp://*:50002", "topic": "kv-events"}
    assert set(prefill) | set(decode) <= documented_flags()


def test_engine_args_may_not_take_over_what_meridian_sets() -> None:
    with pytest.raises(SnapshotInvalid, match="--port"):
        SglangBackend().validate(spec(engine_args=(("port", 1),)))
    with pytest.raises(SnapshotInvalid, match="needs 2 GPUs"):
        SglangBackend().validate(spec(gpu_indexes=(0,)))


def test_on_a_node_without_gpus_sglang_runs_on_the_cpu_with_the_kernel_stand_in() -> None:
    """This interpreter has no sgl_kernel at all: the stand-in is put first on the engine's
    path, and the status says so and why."""
    backend = SglangBackend(python=sys.executable, cpu=True)
    cpu = spec(tp_size=1, gpu_indexes=(0,), engine_args=())
    backend.validate(cpu)
    launch = backend.launch(cpu)
    flags = flag_values(launch.argv)
    assert flags["--device"] == "cpu"
    assert flags["--max-total-tokens"] == str(CPU_KV_TOKENS)  # bounded, unless asked
    assert set(flags) <= documented_flags()
    assert "CUDA_VISIBLE_DEVICES" not in launch.env
    assert launch.env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert launch.env["HF_HUB_OFFLINE"] == "1"
    assert launch.env["PYTHONPATH"] == str(sglang_env.CPU_KERNEL_DIR)
    assert any("stand-in" in n and "sgl_kernel" in n for n in launch.notes), launch.notes
    asked = backend.launch(spec(tp_size=1, engine_args=(("max-total-tokens", 4096),)))
    assert flag_values(asked.argv)["--max-total-tokens"] == "4096"
    with pytest.raises(SnapshotInvalid, match="on its CPU"):
        backend.validate(spec())  # tp 2
    # LoRA: SGLang's torch backend, its pinned memory plain memory (cpu_lora/sitecustomize)
    lora = backend.launch(spec(tp_size=1, engine_args=(("enable-lora", True),)))
    assert flag_values(lora.argv)["--lora-backend"] == "torch_native"
    assert lora.env["PYTHONPATH"].split(os.pathsep) == [
        str(sglang_env.CPU_KERNEL_DIR), str(sglang_env.CPU_LORA_DIR),
    ]  # fmt: skip
    assert (sglang_env.CPU_LORA_DIR / "sitecustomize.py").is_file()
    assert str(sglang_env.CPU_LORA_DIR) not in launch.env["PYTHONPATH"]  # without LoRA


def test_the_kernel_stand_in_imports_and_refuses_every_kernel() -> None:
    code = (
        "import sgl_kernel; assert sgl_kernel.MERIDIAN_STAND_IN\n"
        "from sgl_kernel import fused_experts_cpu\n"
        "try:\n    fused_experts_cpu(1)\nexcept NotImplementedError as e:\n    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(sglang_env.CPU_KERNEL_DIR)},
    )  # fmt: skip
    assert "fused_experts_cpu" in done.stdout


def test_the_sim_launcher_takes_the_same_settings_and_refuses_flags_it_lacks() -> None:
    sim = SimBackend(python="py")
    launch = sim.launch(
        spec(backend="sim", role="prefill", bootstrap_port=40002, kv_events_port=50002)
    )
    assert launch.argv[:4] == ["py", "-m", "meridian", "sim"]
    flags = flag_values(launch.argv)
    assert flags["--served-model-name"] == "llama-3.1-8b-instruct"
    assert flags["--port"] == "30002"
    assert flags["--disaggregation-bootstrap-port"] == "40002"
    assert json.loads(flags["--kv-events-config"] or "")["endpoint"] == "tcp://*:50002"
    assert flags["--mem-fraction-static"] == "0.85"
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    sim.validate(spec(backend="sim"))
    with pytest.raises(SnapshotInvalid, match="no flag --watchdog-timeout"):
        sim.validate(spec(backend="sim", engine_args=(("watchdog-timeout", 30),)))
