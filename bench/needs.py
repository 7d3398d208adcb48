"""What a benchmark needs installed, checked before it starts anything: a sweep must not run
for minutes and then fail on an import."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import click

# the test extra's packages some benchmarks use, by module: what to install
EXTRAS = {"matplotlib": "matplotlib", "sglang_router": "sglang-router"}


def requires(*modules: str) -> None:
    """Stop before anything starts when a package the benchmark will need is not installed
    (a sweep must not run for minutes and then fail on an import)."""
    missing = [EXTRAS.get(m, m) for m in modules if find_spec(m) is None]
    if missing:
        raise click.ClickException(
            f"this benchmark needs {' and '.join(missing)}, from the test extra: "
            f"pip install {' '.join(missing)} (or ./scripts/test --co -q, which makes .venv "
            "with every test dependency)"
        )


def plot_beside(out: Path | None, plot: Path | None) -> Path | None:
    """The PNG to draw: the one asked for (matplotlib required), else one beside --out when
    matplotlib is there."""
    if plot is not None:
        requires("matplotlib")
        return plot
    if out is None:
        return None
    if find_spec("matplotlib") is None:
        click.echo("no plot beside --out: matplotlib is not installed (pip install matplotlib)")
        return None
    return out.with_suffix(".png")


@contextlib.contextmanager
def scratch(name: str) -> Iterator[Path]:
    """A benchmark's scratch directory (its database, agents' data), removed after."""
    root = Path(tempfile.mkdtemp(prefix=f"meridian-bench-{name}-"))
    root.chmod(0o755)  # the embedded PostgreSQL runs as `postgres` when we are root
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
