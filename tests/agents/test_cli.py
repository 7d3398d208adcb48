"""The agent's and the simulator's commands refuse bad input with a clear message."""

from __future__ import annotations

from pathlib import Path

from tests.kits.controlplane import run_cli


async def test_a_first_start_without_a_bootstrap_token_is_refused(tmp_path: Path) -> None:
    code, output = await run_cli(
        "agent", "run", "--control-plane", "127.0.0.1:1", "--region", "us-east",
        "--data-dir", str(tmp_path / "empty"),
    )  # fmt: skip
    assert code == 2
    assert "give --bootstrap-token (or --bootstrap-token-command) for the first start" in output
    assert not (tmp_path / "empty").exists()


async def test_bad_settings_name_the_flag() -> None:
    code, output = await run_cli("agent", "run", "--region", "us-east", "--port", "70000")
    assert code == 2
    assert "--control-plane: Field required" in output
    code, output = await run_cli("sim", "--model", "m", "--error-rate", "2")
    assert code == 2
    assert "--error-rate: Input should be less than or equal to 1" in output
