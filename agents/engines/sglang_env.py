"""The real SGLang's own Python environment: which version Meridian is held to, where the
environment lives, whether it is installed, and what a node without GPUs needs to run it.

SGLang is never installed into Meridian's locked environment: it brings CUDA torch and two
hundred packages of its own (about 11 GB), as operators run it in an image or environment of
its own. Meridian keeps one per version, outside any clone, made once and reused:
`<home>/sglang-<version>/` (home: `~/.cache/meridian` unless told otherwise).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# The one place the supported SGLang version is named: the suite, the conformance test, the
# launcher's CPU path and the docs follow it.
SGLANG_VERSION = "0.5.23"
STAMP = ".meridian-installed"
# The stand-in for sgl_kernel where no real one loads (agents/engines/cpu_kernel/sgl_kernel)
CPU_KERNEL_DIR = Path(__file__).with_name("cpu_kernel")
# pinned memory as plain memory, for LoRA on a CPU node (cpu_lora/sitecustomize.py)
CPU_LORA_DIR = Path(__file__).with_name("cpu_lora")
# SGLang's CPU path: its own engine, and nothing fetched from a hub
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1"}


def default_home() -> Path:
    return Path.home() / ".cache" / "meridian"


def env_dir(home: Path | None = None, version: str = SGLANG_VERSION) -> Path:
    return (home or default_home()) / f"sglang-{version}"


def python_of(directory: Path) -> Path:
    return directory / "bin" / "python"


def installed(directory: Path) -> bool:
    """Installed whole: the stamp is written only after pip and an import succeeded."""
    stamp = directory / STAMP
    return stamp.is_file() and python_of(directory).is_file()


def default_python() -> str:
    """The interpreter an `sglang` engine runs with when the agent is not told: the managed
    environment of the supported version where it is installed, else `python3` on PATH (an
    image that installed SGLang into its system Python)."""
    directory = env_dir()
    return str(python_of(directory)) if installed(directory) else "python3"


def install(directory: Path, on_line: Callable[[str], None], version: str = SGLANG_VERSION) -> None:
    """Make the environment and pip-install `sglang==version` into it; `on_line` hears pip's
    output. Raises RuntimeError with pip's last lines if it fails; the stamp is left
    unwritten, so a later call tries again."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    python = python_of(directory)
    if not python.is_file():
        _run([sys.executable, "-m", "venv", str(directory)], on_line)
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
    _run([*pip, f"sglang=={version}"], on_line)
    _run([str(python), "-c", "import sglang, transformers, torch"], on_line)
    (directory / STAMP).write_text(version + "\n")


def _run(argv: list[str], on_line: Callable[[str], None]) -> None:
    tail: list[str] = []
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            line = line.rstrip()
            tail = [*tail[-19:], line]
            on_line(line)
    if process.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv[:4])} ... exited with {process.returncode}:\n" + "\n".join(tail)
        )


@dataclass(frozen=True)
class KernelCheck:
    """Whether the real sgl_kernel loads under `python`; `reason` says why not."""

    loads: bool
    reason: str


def check_kernel(python: str) -> KernelCheck:
    """Import sgl_kernel in the engine's interpreter, as the engine will (a few seconds: it
    imports torch). A blocking call: run it off the event loop."""
    try:
        done = subprocess.run(
            [python, "-c", "import sgl_kernel"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return KernelCheck(False, f"{python} could not be run: {error}")
    if done.returncode == 0:
        return KernelCheck(True, "")
    lines = [line.strip(" -") for line in done.stderr.splitlines() if line.strip()]
    said = [line for line in lines if "Error: " in line and not line.endswith("Error:")]
    reason = (said or lines or [f"exit {done.returncode}"])[-1]
    return KernelCheck(False, reason)
