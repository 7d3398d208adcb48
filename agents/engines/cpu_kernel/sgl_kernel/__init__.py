"""Meridian's stand-in for `sgl_kernel` on a node without GPUs (never used on a GPU node).

SGLang 0.5.23 imports `sgl_kernel` at start, and the wheel on PyPI (`sglang-kernel`) is
built for CUDA only: without `libcuda.so.1` it fails to load, and no CPU build is published.
This module, put first on the engine's PYTHONPATH by the agent's launcher only where the real
one does not load, registers no `torch.ops.sgl_kernel` ops. Seeing none, SGLang takes its own
pure-torch paths (`torch_native` attention, `pytorch` sampling). Names it imports (those
ending in `_cpu` on the CPU path) resolve to functions that raise if ever called, so a path
that would need a real kernel fails loudly instead of computing something else.
"""

from __future__ import annotations

from typing import Any, NoReturn

__version__ = "0.0.0+meridian-cpu-stand-in"
MERIDIAN_STAND_IN = True


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{name}: Meridian's CPU stand-in has no kernels; SGLang should have "
            "chosen its pure-torch path"
        )

    missing.__name__ = name
    return missing
