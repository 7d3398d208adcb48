"""/agent/* and /metrics always need the operator token: a tenant must not see which worker
served which request. An agent given none makes its own, keeps it in its data directory
(readable by its owner only) and keeps it across restarts."""

from __future__ import annotations

from pathlib import Path

import httpx

from meridian.procs import free_port
from tests.kits.agents import running_agent

GUARDED = ("/agent/status", "/agent/decisions", "/metrics")


async def test_an_agent_given_no_token_makes_one_and_guards_its_views(tmp_path: Path) -> None:
    unreachable = f"127.0.0.1:{free_port()}"  # no control plane: the views answer anyway
    tokens = []
    for _ in range(2):  # a restart keeps the token
        async with running_agent(
            unreachable, "eu-west", tmp_path, operator="", token="mbt_unreachable-control-plane"
        ) as agent:
            path = tmp_path / "operator-token"
            token = path.read_text().strip()
            tokens.append(token)
            assert path.stat().st_mode & 0o077 == 0
            async with httpx.AsyncClient(base_url=agent.url, timeout=5) as http:
                for view in GUARDED:
                    anonymous = await http.get(view)
                    assert anonymous.status_code == 401, view
                    assert anonymous.json()["code"] == "invalid_api_key"
                    wrong = await http.get(view, headers={"Authorization": "Bearer sk-tenant"})
                    assert wrong.status_code == 401, view
                    held = await http.get(view, headers={"Authorization": f"Bearer {token}"})
                    assert held.status_code == 200, view
    assert len(tokens[0]) >= 16
    assert tokens[0] == tokens[1]
