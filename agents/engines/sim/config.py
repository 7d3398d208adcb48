"""The simulator's settings: the launch_server flags it understands, and its own knobs."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agents.engines.sglang_env import SGLANG_VERSION
from agents.engines.sim.cost import CostModel
from agents.engines.sim.kv_events import KvEventsConfig
from agents.engines.sim.request import Priority
from agents.engines.sim.tokens import MODEL_DIR

SUFFIX = "-meridian-sim"  # of its version: what tells a simulator from SGLang
VERSION = f"{SGLANG_VERSION}{SUFFIX}"  # the SGLang it imitates


class SimConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=30000, ge=1, le=65535)
    served_model_name: str = Field(min_length=1)
    model_path: Path = MODEL_DIR
    tp_size: int = Field(default=1, ge=1, le=64)
    dp_size: int = Field(default=1, ge=1, le=64)
    mem_fraction_static: float = Field(default=0.88, gt=0, le=1)
    max_running_requests: int = Field(default=256, ge=1, le=65536)
    max_total_tokens: int = Field(default=CostModel().max_total_tokens, ge=16)
    context_length: int = Field(default=131072, ge=16)
    max_prefill_tokens: int = Field(default=16384, ge=1)
    chunked_prefill_size: int = Field(default=8192, ge=-1, description="-1: no chunking")
    page_size: int = Field(default=1, ge=1, le=4096)
    kv_events_config: KvEventsConfig | None = None
    stream_interval: int = Field(default=1, ge=1, le=1024)
    schedule_policy: str = "fcfs"
    enable_priority_scheduling: bool = False
    disable_priority_preemption: bool = False
    default_priority_value: int | None = None
    schedule_low_priority_values_first: bool = False
    priority_scheduling_preemption_threshold: int = 10
    retraction_policy: Literal["length", "priority"] = "length"
    disaggregation_mode: Literal["null", "prefill", "decode"] = "null"
    disaggregation_bootstrap_port: int = Field(default=8998, ge=1, le=65535)
    enable_metrics: bool = False
    enable_cache_report: bool = False
    enable_lora: bool = False
    max_lora_rank: int | None = Field(default=None, ge=1, le=1024)
    lora_target_modules: str | None = Field(default=None, max_length=1024)
    max_loras_per_batch: int = Field(default=8, ge=1, le=1024)
    max_loaded_loras: int | None = Field(default=None, ge=1, le=100_000)
    lora_backend: str = "csgmv"
    # Simulator knobs.
    lora_load_s: float = Field(default=0.05, ge=0, le=60, description="time to load an adapter")
    lora_paths: tuple[str, ...] = Field(default=(), description="name=path of adapters it knows")
    startup_s: float = Field(default=0.0, ge=0, le=600, description="time to 'load weights'")
    speed_factor: float = Field(
        default=1.0, gt=0, le=100, description="this engine's hardware speed: 2 is twice as fast"
    )
    slow_factor: float = Field(default=1.0, gt=0, le=1000)
    error_rate: float = Field(default=0.0, ge=0, le=1)
    hang: bool = False
    crash_after_s: float | None = Field(default=None, ge=0)
    seed: int = 0
    fail_marker: str | None = Field(
        default=None, min_length=1, max_length=64,
        description="requests whose prompt holds <marker>:json|tool|length|logprob fail so",
    )  # fmt: skip

    @model_validator(mode="after")
    def _priority_policy(self) -> SimConfig:
        if self.enable_priority_scheduling and self.schedule_policy not in ("fcfs", "lof"):
            # as SGLang refuses it
            raise ValueError(
                f"To use priority scheduling, schedule_policy must be 'fcfs' or 'lof'. "
                f"'{self.schedule_policy}' is not supported."
            )
        if self.retraction_policy == "priority" and not self.enable_priority_scheduling:
            raise ValueError("--retraction-policy priority requires --enable-priority-scheduling")
        if self.enable_lora and (self.max_lora_rank is None or not self.lora_target_modules):
            raise ValueError(  # as SGLang refuses it (it has no --lora-paths here)
                "When no initial --lora-paths is provided, you need to specify both "
                "--max-lora-rank and --lora-target-modules for LoRA initialization."
            )
        if any("=" not in p for p in self.lora_paths):
            raise ValueError("--lora-paths takes name=path")
        if self.max_loaded_loras is not None and self.max_loaded_loras < self.max_loras_per_batch:
            raise ValueError("--max-loaded-loras must be at least --max-loras-per-batch")
        return self

    def priority(self) -> Priority | None:
        """Its priority scheduling, when on."""
        if not self.enable_priority_scheduling:
            return None
        return Priority(
            default=self.default_priority_value,
            low_first=self.schedule_low_priority_values_first,
            preempt=not self.disable_priority_preemption,
            threshold=self.priority_scheduling_preemption_threshold,
            retract_by_priority=self.retraction_policy == "priority",
        )

    @property
    def role(self) -> Literal["unified", "prefill", "decode"]:
        return "unified" if self.disaggregation_mode == "null" else self.disaggregation_mode

    def cost(self) -> CostModel:
        return CostModel(max_total_tokens=self.max_total_tokens)

    def server_info(self) -> dict[str, object]:
        """Every flag, flat, as SGLang's /server_info shows them."""
        flags = self.model_dump(mode="json")
        flags["model_path"] = str(self.model_path)
        flags["tokenizer_path"] = str(self.model_path)
        flags["kv_events_config"] = (
            self.kv_events_config.model_dump_json() if self.kv_events_config else None
        )
        flags["enable_kv_events"] = self.kv_events_config is not None
        return flags
