"""LoRA adapters in the simulator, as SGLang 0.5.23 serves them at run time (measured on the
real engine: tests/sglang/test_lora.py; read in its source: tokenizer_control_mixin.py and
tokenizer_manager.py).

- `POST /load_lora_adapter {"lora_name", "lora_path", "pinned"}` loads one (taking
  `--lora-load-s`): 200 `{"success": true, "error_message": "", "loaded_adapters": {name:
  path}}`; 400 with `success: false` when it is loaded already, when its files are not
  there, when its rank is above `--max-lora-rank`, or when LoRA is not enabled. Past
  `--max-loaded-loras`, the least recently used adapter that is not pinned is unloaded.
- `POST /unload_lora_adapter {"lora_name"}`: 200, or 400 (`loaded_adapters: null`) for one
  not loaded.
- A request names an adapter as `model: "<served>:<adapter>"` (which wins) or `lora_path`.
  One never loaded is a 400; one loaded once and unloaded since (or evicted) is loaded again
  first, from where it came, as SGLang does. A bare adapter name in `model` is not read:
  the base model serves it.
- `/v1/models` lists the adapters loaded, each with `parent` the served model and `root`
  its path.

The prefix cache is kept per adapter (agents/engines/sim/radix.py's namespaces), and KV
events name it (`lora_name`). Not yet simulated: `--max-loras-per-batch` in the scheduler.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.engines.sim.generation import SimError

NOT_ENABLED = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."


@dataclass(slots=True)
class Ref:
    name: str
    path: str
    lora_id: str
    pinned: bool


class Loras:
    """The adapters one engine holds, and those it has held (it loads those again on use)."""

    def __init__(
        self, enabled: bool, max_rank: int | None, max_loaded: int | None, load_s: float
    ) -> None:
        self.enabled, self.max_rank, self.max_loaded, self.load_s = (
            enabled, max_rank, max_loaded, load_s,
        )  # fmt: skip
        self.loaded: OrderedDict[str, Ref] = OrderedDict()  # least recently used first
        self.known: dict[str, Ref] = {}
        self.loads = 0  # each a load's time spent (a cold one among them)
        self._lock = asyncio.Lock()

    def _answer(self, status: int, error: str = "", listed: bool = True) -> tuple[int, Any]:
        adapters = {n: r.path for n, r in self.loaded.items()} if listed else None
        return status, {"rid": None, "http_worker_ipc": None, "success": status == 200,
                        "error_message": error, "loaded_adapters": adapters}  # fmt: skip

    async def load(self, name: str, path: str, pinned: bool = False) -> tuple[int, Any]:
        if not self.enabled:
            return self._answer(400, NOT_ENABLED, listed=False)
        async with self._lock:
            if name in self.loaded:
                return self._answer(
                    400, f"Failed to load LoRA adapter {name} because it is already loaded"
                )
            problem = self._problem(name, path)
            if problem is not None:
                return self._answer(400, problem, listed=False)
            await asyncio.sleep(self.load_s)
            self.loads += 1
            self.loaded[name] = self.known[name] = Ref(name, path, uuid.uuid4().hex, pinned)
            while self.max_loaded is not None and len(self.loaded) > self.max_loaded:
                lru = next((n for n, r in self.loaded.items() if not r.pinned), None)
                if lru is None:
                    break
                del self.loaded[lru]
            return self._answer(200)

    def _problem(self, name: str, path: str) -> str | None:
        """Why the adapter at `path` cannot be loaded, or None."""
        try:
            config = json.loads((Path(path) / "adapter_config.json").read_text())
            rank = int(config["r"])
        except (OSError, ValueError, KeyError, TypeError):
            return f"Failed to load LoRA adapter {name}: no PEFT adapter at {path!r}"
        if self.max_rank is not None and rank > self.max_rank:
            return (f"LoRA adapter {name} with rank {rank} is incompatible with the current "
                    "LoRA memory pool configuration. Please ensure that the LoRA adapter's "
                    "rank is within the configured `--max-lora-rank`.")  # fmt: skip
        return None

    async def unload(self, name: str) -> tuple[int, Any]:
        if not self.enabled:
            return self._answer(400, NOT_ENABLED, listed=False)
        async with self._lock:
            if name not in self.loaded:
                message = (f"LoRA with name {name} does not exist. Loaded LoRAs: "
                           f"odict_keys({list(self.loaded)})")  # fmt: skip
                return self._answer(400, message, listed=False)
            del self.loaded[name]
            return self._answer(200)

    async def resolve(self, adapter: str) -> Ref:
        """The adapter a request names, loaded again first if it was unloaded; SimError 400
        when LoRA is off or it was never loaded."""
        if not self.enabled:
            raise SimError(400, f"LoRA adapter '{adapter}' was requested, but LoRA is not "
                           "enabled. Please launch the server with --enable-lora flag and "
                           "preload adapters using --lora-paths or /load_lora_adapter "
                           "endpoint.")  # fmt: skip
        ref = self.loaded.get(adapter)
        if ref is None:
            known = self.known.get(adapter)
            if known is None:
                raise SimError(400, f"Got LoRA adapter that has never been loaded: {adapter}\n"
                               f"All loaded adapters: dict_keys({list(self.known)}).")  # fmt: skip
            status, answer = await self.load(adapter, known.path, known.pinned)
            if status != 200 and adapter not in self.loaded:
                raise SimError(400, str(answer["error_message"]))
            ref = self.loaded[adapter]
        self.loaded.move_to_end(adapter)
        return ref

    def cards(self, served: str, created: int) -> list[dict[str, object]]:
        return [{"id": r.name, "object": "model", "created": created, "owned_by": "sglang",
                 "root": r.path, "parent": served, "max_model_len": None}
                for r in self.loaded.values()]  # fmt: skip


def asked(raw: bytes, served: str, native: bool) -> str | None:
    """The adapter a request's body names: `model` as `<served>:<adapter>` (or any `a:b`),
    which wins, else `lora_path` (a batch's: its first); None for none (or a body that is
    not JSON: the endpoint says so)."""
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    model = body.get("model")
    if not native and isinstance(model, str) and ":" in model and model != served:
        rest = (
            model[len(served) + 1 :] if model.startswith(f"{served}:") else model.split(":", 1)[1]
        )
        if rest.strip():
            return rest.strip()
    path = body.get("lora_path")
    if isinstance(path, list):
        path = next((p for p in path if p), None)
    return path if isinstance(path, str) and path else None
