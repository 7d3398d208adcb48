"""`meridian bench` stops at once, naming what to install, when a package it needs is not
there: a sweep must not run for minutes and then fail on an import, its results lost."""

from __future__ import annotations

import importlib.util
from importlib.machinery import ModuleSpec
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from bench import cli, needs


def _without(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str) -> ModuleSpec | None:
        return None if name == module else real(name)

    monkeypatch.setattr(needs, "find_spec", find_spec)


@pytest.mark.parametrize("command", ["routing", "overhead"])
def test_a_benchmark_without_sglang_router_stops_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, command: str
) -> None:
    _without(monkeypatch, "sglang_router")
    out = tmp_path / "result.json"
    result = CliRunner().invoke(cli.bench, [command, "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert "pip install sglang-router" in result.output
    assert not out.exists()


def test_without_matplotlib_a_plot_asked_for_stops_and_one_implied_is_skipped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _without(monkeypatch, "matplotlib")
    out = tmp_path / "result.json"
    with pytest.raises(click.ClickException, match="pip install matplotlib"):
        needs.plot_beside(out, tmp_path / "asked.png")
    assert needs.plot_beside(out, None) is None
    result = CliRunner().invoke(cli.bench, ["quotas", "--plot", str(tmp_path / "q.png")])
    assert result.exit_code == 1, result.output
    assert "matplotlib" in result.output
