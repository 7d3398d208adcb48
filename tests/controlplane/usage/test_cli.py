"""`meridian usage` and `meridian usage export`, as an operator runs them against a real
control plane."""

from __future__ import annotations

import csv
from pathlib import Path

from controlplane.db.engine import Database
from controlplane.services.usage.store import UsageStore
from tests.controlplane.usage.test_report import _at, _record
from tests.kits.controlplane import ADMIN_TOKEN, Server, run_cli


async def test_usage_prints_the_sums_and_exports_the_records(
    server: Server, database_url: str, tmp_path: Path
) -> None:
    db = Database.connect(database_url, pool_size=1)
    try:
        await UsageStore(db).store([
            _record(1, _at(2026, 11, 2, 9, 0), "acme", "llama"),
            _record(2, _at(2026, 11, 2, 10, 0), "acme", "llama"),
            _record(3, _at(2026, 11, 3, 9, 0), "globex", "qwen"),
        ], "eu-west", "eu-west-1")  # fmt: skip
    finally:
        await db.close()
    env = {"MERIDIAN_URL": server.url, "MERIDIAN_TOKEN": ADMIN_TOKEN}
    period = ["--since", "2026-11-01", "--until", "2026-12-01", "--tz", "Europe/Paris"]
    code, output = await run_cli("usage", *period, "--by", "tenant,model", "--bucket", "month",
                                 env=env)  # fmt: skip
    assert code == 0, output
    lines = [line for line in output.splitlines() if "2026-11" in line or "total" in line]
    assert len(lines) == 3, output
    assert "acme" in lines[0]
    assert "llama" in lines[0]
    assert "0.002000" in lines[0]
    assert "globex" in lines[1]
    assert "qwen" in lines[1]
    assert "0.003000" in lines[2]  # three requests at $0.001 each
    out = tmp_path / "usage.csv"
    code, output = await run_cli("usage", "export", *period, "--format", "csv", "--tenant",
                                 "acme", "-o", str(out), env=env)  # fmt: skip
    assert code == 0, output
    rows = list(csv.DictReader(out.open()))
    assert [r["request_id"] for r in rows] == ["r1", "r2"]
    code, output = await run_cli("usage", "--since", "2026-11-01", "--tz", "Mars/Olympus",
                                 env=env)  # fmt: skip
    assert code == 2
    assert "no time zone named 'Mars/Olympus'" in output
    code, output = await run_cli("usage", "--since", "yesterday", env=env)
    assert code == 2
    assert "neither a date" in output
