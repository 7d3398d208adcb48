"""Pinned memory as plain memory, for SGLang's LoRA on a node without GPUs.

SGLang 0.5.23's LoRA layers, adapter pool and `torch_native` LoRA backend pin their host-side
tensors (`pin_memory=True`, `.pin_memory()`), which torch refuses without a CUDA driver
("Found no NVIDIA driver on your system"), so an engine started with `--enable-lora --device
cpu` dies while it builds its LoRA modules. Pinning only speeds copies to a GPU: on a CPU
node, where there is none, plain memory is the same memory. This module, put on the engine's
PYTHONPATH by the agent's launcher only on a CPU node whose engine enables LoRA
(agents/engines/backends.py), is imported by Python at start (as `sitecustomize`) in the
engine and in each of its processes, and makes pinning a no-op there when torch sees no CUDA.
Nothing else changes: the adapters' weights and SGLang's LoRA arithmetic are its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

# torch's factories that take `pin_memory`
FACTORIES = ("tensor", "as_tensor", "empty", "empty_like", "empty_strided", "zeros",
             "zeros_like", "ones", "ones_like", "full", "full_like", "arange")  # fmt: skip


def _unpinned(factory: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(factory)
    def made(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("pin_memory", None)
        return factory(*args, **kwargs)

    return made


def _same(tensor: torch.Tensor, *_args: Any, **_kwargs: Any) -> torch.Tensor:
    return tensor


if not torch.cuda.is_available():
    torch.Tensor.pin_memory = _same
    for _name in FACTORIES:
        setattr(torch, _name, _unpinned(getattr(torch, _name)))
