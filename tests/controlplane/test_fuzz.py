"""The admin API fuzzed from its own OpenAPI document by schemathesis, every check on, against a
real server on a real PostgreSQL holding the example fleet: no server error, no undocumented
status or content type, no response off its schema, bad input refused, good input taken."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from tests import fuzz_kit
from tests.kits.controlplane import ADMIN_TOKEN, Server
from tests.kits.fleet_docs import EXAMPLE

CONFIG = Path(__file__).with_name("fuzz") / "schemathesis.toml"
# A fixed seed, so that CI is repeatable; MERIDIAN_FUZZ_SEED explores further, and
# MERIDIAN_FUZZ_EXAMPLES raises the cases per operation.
SEED = os.environ.get("MERIDIAN_FUZZ_SEED", "20261123")
EXAMPLES = os.environ.get("MERIDIAN_FUZZ_EXAMPLES", "8")


async def test_the_admin_api_survives_fuzzing_from_its_openapi_document(
    server: Server, tmp_path: Path
) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/yaml"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers) as http:
        applied = await http.post("/v1/apply", content=EXAMPLE.read_text())
        assert applied.status_code == 200, applied.text
    status, output, result = await fuzz_kit.schemathesis(
        f"{server.url}/openapi.json", CONFIG, tmp_path,
        headers=[f"Authorization: Bearer {ADMIN_TOKEN}"], examples=EXAMPLES, seed=SEED,
    )  # fmt: skip
    assert status == 0, output[-20000:]
    fuzz_kit.reported(
        "fuzzing the admin API from its OpenAPI document (schemathesis, every check)", result
    )
    cases = result["test_cases"]
    assert result["operations"]["tested"] == result["operations"]["total"] >= 70
    assert cases["generated"] >= 1000
    assert cases["with_failures"] == 0
    assert result["failures"] == []
    assert result["errors"] == []
