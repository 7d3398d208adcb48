"""The CLI and the server as an operator runs them: real processes over real HTTP."""

from __future__ import annotations

import httpx

from tests.kits.controlplane import ADMIN_TOKEN, Server, run_cli
from tests.kits.fleet_docs import EXAMPLE


async def test_apply_command_shows_the_diff_and_is_idempotent(server: Server) -> None:
    env = {"MERIDIAN_URL": server.url, "MERIDIAN_TOKEN": ADMIN_TOKEN}
    code, output = await run_cli("apply", "-f", str(EXAMPLE), "--dry-run", env=env)
    assert code == 0, output
    assert "+ region eu-west" in output
    assert "would change" in output

    code, output = await run_cli("apply", "-f", str(EXAMPLE), env=env)
    assert code == 0, output
    assert "28 object(s) changed; revision 1" in output

    code, output = await run_cli("apply", "-f", str(EXAMPLE), env=env)
    assert code == 0, output
    assert "no changes; revision 1" in output


async def test_apply_command_reports_problems(server: Server, tmp_path: object) -> None:
    from pathlib import Path

    bad = Path(str(tmp_path)) / "bad.yaml"
    bad.write_text(
        "regions:\n  - name: r1\n    cloud: nowhere\n    geography: x\n    jurisdiction: us\n"
    )
    env = {"MERIDIAN_URL": server.url, "MERIDIAN_TOKEN": ADMIN_TOKEN}
    code, output = await run_cli("apply", "-f", str(bad), env=env)
    assert code == 1
    assert "422 unknown_reference" in output
    assert "cloud" in output
    code, output = await run_cli("apply", "-f", str(EXAMPLE), env={**env, "MERIDIAN_TOKEN": "x"})
    assert code == 1
    assert "401" in output


async def test_server_answers_health_docs_and_problems(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url) as client:
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        assert (await client.get("/readyz")).json()["status"] == "ready"
        spec = (await client.get("/openapi.json")).json()
        assert "/v1/deployments/{name}" in spec["paths"]
        missing = await client.get("/v1/nowhere")
        assert missing.status_code == 404
        assert missing.json()["code"] == "not_found"
