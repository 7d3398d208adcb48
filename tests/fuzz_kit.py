"""schemathesis run as its own command against a live server, every check on, one worker; its
JSON report read back. Shared by the admin API's and the gateway's fuzz tests."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from tests import report


async def schemathesis(
    document_url: str,
    config: Path,
    workdir: Path,
    *,
    headers: list[str],
    examples: str,
    seed: str,
    extra: tuple[str, ...] = (),
    timeout_s: float = 600,
) -> tuple[int | None, str, dict[str, Any]]:
    """The exit status, the output and the JSON report of one run."""
    results = workdir / "report.json"
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(config),
        "run", document_url, "--checks", "all",
        *[arg for header in headers for arg in ("-H", header)],
        "--max-examples", examples, "--seed", seed,
        # one worker: CPython 3.11's AST constructor is not safe across threads (hypothesis
        # parses strategies' sources), and two cores are all there is
        "--workers", "1", *extra,
        "--no-color", "--report", "json", "--report-json-path", str(results),
        "--generation-database", "none", cwd=workdir,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    result = json.loads(results.read_text()) if results.exists() else {}
    return proc.returncode, output.decode(), result


def reported(section: str, result: dict[str, Any], more: str = "") -> None:
    cases = result["test_cases"]
    report.add(
        section,
        f"{cases['generated']} cases over {result['operations']['tested']} operations in "
        f"{result['running_time']:.0f} s (seed {result['seed']}): {cases['with_failures']} "
        f"with failures (a 5xx is one), {len(result['errors'])} errors{more}",
    )
