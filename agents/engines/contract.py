"""What the agent reads from an SGLang engine, as SGLang 0.5.23 answers (and the simulator,
held to it by tests/agents/engines/test_conformance.py): one reader per answer, pure.

- `GET /ready`: the cheap readiness check (503 while starting or draining, then 200).
  `/health` runs a one-token generation on 0.5.23 (a second or more): used rarely.
- `GET /v1/loads`: `{version, loads: [{dp_rank, num_running_reqs, num_waiting_reqs,
  num_waiting_uncached_tokens, num_used_tokens, max_total_num_tokens, gen_throughput,
  ...}]}`, one entry per DP rank. `/get_load` is gone (404) on 0.5.23: servers without
  `/v1/loads` are not supported.
- `GET /server_info`: the flags flat, and at the top level `version`,
  `max_total_num_tokens` and `kv_events` (the publisher's config); `internal_states` holds
  no capacity.
- `GET /v1/models`: the served model, and each LoRA adapter loaded with `parent` the served
  model and `root` the path it was loaded from. `POST /load_lora_adapter {lora_name,
  lora_path, pinned}` and `POST /unload_lora_adapter {lora_name}` answer `{success,
  error_message, loaded_adapters}` (400 when they fail; loading one loaded already among
  them). A request naming an adapter the engine never loaded is a 400 (`NEVER_LOADED`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meridian_pb.fleet.v1.classes import CLASSES, ServiceClass

READY = "/ready"
HEALTH = "/health"  # generates: seconds, not milliseconds
LOADS = "/v1/loads"
SERVER_INFO = "/server_info"
METRICS = "/metrics"
MODELS = "/v1/models"
LOAD_LORA = "/load_lora_adapter"
UNLOAD_LORA = "/unload_lora_adapter"
NEVER_LOADED = "never been loaded"  # in the 400 for an adapter the engine does not know
ALREADY_LOADED = "already loaded"  # in the 400 for a load of one it holds

# SGLang's own priority scheduling (--enable-priority-scheduling; higher values first), which
# Meridian turns on where it starts an engine: the engine takes a request by its class from
# its queue, and a request two classes or more above a running one may retract it when every
# slot is taken (SGLang's --priority-scheduling-preemption-threshold, 10 by default: the
# difference must be over it). A retracted request is not lost: it waits and is served later.
# When its KV pool runs short the engine retracts the shortest answer so far (SGLang's default
# `--retraction-policy length`), whatever its class. `priority` (the lowest class first) was
# measured worse beside a batch flood (`meridian bench classes`: interactive TTFT p99 3.96 s
# against 1.70 s, batch 33 tok/s against 485): a retracted batch answer is computed again and
# every retraction makes the engine reserve more for what runs, so it retracted 43 times
# against 16. An operator may still set it in engine_args.
PRIORITY_STEP = 10
PRIORITY_POLICIES = frozenset({"fcfs", "lof"})  # the schedule policies priorities work with


def engine_priority(served: ServiceClass) -> int:
    """The `priority` a request of class `served` is sent to its engine with."""
    return (len(CLASSES) - 1 - served) * PRIORITY_STEP


DEFAULT_PRIORITY = engine_priority(ServiceClass.STANDARD)  # a request sent without one


@dataclass(frozen=True)
class LoadReading:
    """One `/v1/loads` answer, summed over DP ranks."""

    running: int
    waiting: int
    used_tokens: int
    pending_tokens: int  # prompt tokens waiting for prefill that the cache does not hold
    max_total_tokens: int
    step_s: float  # seconds a token of each running answer takes now; 0 while idle
    version: str
    max_running: int = 0  # requests it runs at once at the most (all ranks); 0: not said


SILENT_AFTER = 2  # polls of `/v1/loads` in a row without an answer: it does not answer


@dataclass(frozen=True)
class Seen:
    """What the load poller (the one observer of an engine's load) saw of it lately."""

    reading: LoadReading | None  # its last answer, kept through the polls it missed since
    failed: int  # polls in a row it did not answer

    @property
    def silent(self) -> bool:
        """It stopped answering `/v1/loads`, which goes through its scheduler: wedged, or
        gone."""
        return self.failed >= SILENT_AFTER


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _float(value: Any) -> float:
    try:
        return float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0


def read_loads(document: Any) -> LoadReading:
    """Raises ValueError when it is not a `/v1/loads` answer."""
    if not isinstance(document, dict) or not isinstance(document.get("loads"), list):
        raise ValueError("not a /v1/loads answer (no `loads` list)")
    ranks = [r for r in document["loads"] if isinstance(r, dict)]
    running = sum(_int(r.get("num_running_reqs")) for r in ranks)
    throughput = sum(_float(r.get("gen_throughput")) for r in ranks)
    return LoadReading(
        running=running,
        waiting=sum(_int(r.get("num_waiting_reqs")) for r in ranks),
        used_tokens=sum(_int(r.get("num_used_tokens")) for r in ranks),
        pending_tokens=sum(_int(r.get("num_waiting_uncached_tokens")) for r in ranks),
        max_total_tokens=sum(_int(r.get("max_total_num_tokens")) for r in ranks),
        # SGLang's gen_throughput is tokens a second over its last decode log interval, for
        # all running answers together: one answer's token takes running / throughput
        step_s=running / throughput if running > 0 and throughput > 0 else 0.0,
        version=str(document.get("version") or ""),
        max_running=sum(_int(r.get("max_running_requests")) for r in ranks),
    )


@dataclass(frozen=True)
class ServerInfo:
    max_total_tokens: int  # the KV pool (all DP ranks); 0 when it does not say
    page_size: int
    tokenizer_path: str | None
    version: str
    kv_events: bool
    lora: bool = False  # started with --enable-lora
    max_loaded_loras: int | None = None  # adapters it holds at once at the most; None: any


def read_server_info(info: Any) -> ServerInfo:
    if not isinstance(info, dict):
        raise ValueError("not a /server_info answer")
    path = info.get("tokenizer_path") or info.get("model_path")
    events = info.get("kv_events") or info.get("kv_events_config")
    return ServerInfo(
        max_total_tokens=_int(info.get("max_total_num_tokens")),
        page_size=max(1, _int(info.get("page_size")) or 1),
        tokenizer_path=str(path) if path else None,
        version=str(info.get("version") or ""),
        kv_events=bool(events),
        lora=info.get("enable_lora") is True,
        max_loaded_loras=_int(info.get("max_loaded_loras")) or None,
    )


def read_adapters(document: Any) -> dict[str, str]:
    """The LoRA adapters a `/v1/models` answer lists as loaded: name to the path loaded from.
    Raises ValueError when it is not one."""
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        raise ValueError("not a /v1/models answer (no `data` list)")
    return {
        str(card["id"]): str(card.get("root") or "")
        for card in document["data"]
        if isinstance(card, dict) and card.get("parent") and card.get("id")
    }
