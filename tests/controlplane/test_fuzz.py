"""The admin API fuzzed from its own OpenAPI document by schemathesis, every check on, against a
real server on a real PostgreSQL holding the example fleet: no server error, no undocumented
status or content type, no response off its schema, bad input refused, good input taken."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import httpx

from tests import report
from tests.controlplane.conftest import ADMIN_TOKEN, Server
from tests.controlplane.fleet import EXAMPLE

CONFIG = Path(__file__).with_name("fuzz") / "schemathesis.toml"
# A fixed seed, so that CI is repeatable; MERIDIAN_FUZZ_SEED explores further, and
# MERIDIAN_FUZZ_EXAMPLES raises the cases per operation.
SEED = os.environ.get("MERIDIAN_FUZZ_SEED", "20261123")
EXAMPLES = os.environ.get("MERIDIAN_FUZZ_EXAMPLES", "20")


async def test_the_admin_api_survives_fuzzing_from_its_openapi_document(
    server: Server, tmp_path: Path
) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/yaml"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers) as http:
        applied = await http.post("/v1/apply", content=EXAMPLE.read_text())
        assert applied.status_code == 200, applied.text
    results_file = tmp_path / "report.json"
    schemathesis = Path(sys.executable).with_name("schemathesis")
    proc = await asyncio.create_subprocess_exec(
        str(schemathesis), "--config-file", str(CONFIG), "run", f"{server.url}/openapi.json",
        "--checks", "all", "-H", f"Authorization: Bearer {ADMIN_TOKEN}",
        "--max-examples", EXAMPLES, "--seed", SEED,
        # one worker: CPython 3.11's AST constructor is not safe across threads (hypothesis
        # parses strategies' sources), and two cores are all there is
        "--workers", "1",
        "--no-color", "--report", "json", "--report-json-path", str(results_file),
        "--generation-database", "none", cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(proc.communicate(), 600)
    text = output.decode()
    assert proc.returncode == 0, text[-20000:]
    result = json.loads(results_file.read_text())
    cases = result["test_cases"]
    report.add(
        "fuzzing the admin API from its OpenAPI document (schemathesis, every check)",
        f"{cases['generated']} cases over {result['operations']['tested']} operations in "
        f"{result['running_time']:.0f} s (seed {result['seed']}): {cases['with_failures']} "
        f"with failures (a 5xx is one), {len(result['errors'])} errors",
    )
    assert result["operations"]["tested"] == result["operations"]["total"] >= 70
    assert cases["generated"] >= 1000
    assert cases["with_failures"] == 0
    assert result["failures"] == []
    assert result["errors"] == []
