"""The agent bootstrap that every cloud's node pool uses (terraform/modules/agent-bootstrap):
rendered by terraform itself, checked for what must never be in user data, and run for real in
a scratch root, where the agent it starts must register with a real control plane and run
its simulated engines."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from meridian.procs import free_port, stop_child
from tests.controlplane.conftest import start_server
from tests.controlplane.push.kit import ADMIN, eventually
from tests.fleet.kit import OPERATOR, fleet_document
from tests.terraform.kit import TERRAFORM, render, terraform

REPO = Path(__file__).resolve().parents[2]
TOKEN_FILE = "/run/secrets/meridian-bootstrap-token"  # as a secret store would hand it over

BASE: dict[str, Any] = {
    "region": "us-west",
    "control_plane": "cp.internal.example:8401",
    "bootstrap_token_command": f"cat {TOKEN_FILE}",
}


async def test_every_terraform_file_is_formatted(tmp_path: Path) -> None:
    code, out = await terraform(tmp_path, "fmt", "-check", "-recursive", "-diff", str(TERRAFORM),
                                check=False)  # fmt: skip
    assert code == 0, f"run `terraform fmt -recursive terraform/`:\n{out}"


async def test_the_rendered_bootstrap_carries_no_secret_and_is_valid_bash(tmp_path: Path) -> None:
    out = await render(tmp_path, "agent-bootstrap", {**BASE, "agent_settings": {"NODE": "n-1"}})
    script = out["script"]
    assert base64.b64decode(out["cloud_init"].split("content: ")[1].split("\n")[0]).decode() == (
        script
    )  # the same script as cloud-init user data
    check = await asyncio.create_subprocess_exec("bash", "-n", stdin=asyncio.subprocess.PIPE)
    await check.communicate(script.encode())
    assert check.returncode == 0
    assert f"cat {TOKEN_FILE}" in script  # the token is read at boot, never written here
    assert "BOOTSTRAP_TOKEN='" not in script
    assert "'MERIDIAN_AGENT_REGION' 'us-west'" in script
    assert "'MERIDIAN_AGENT_NODE' 'n-1'" in script
    assert "Restart=always" in script


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("region", "us west", "region must be"),
        ("control_plane", "http://cp:8401", "control_plane must be"),
        ("bootstrap_token_command", " ", "never goes in user data"),
        ("port", 70000, "port must be"),
        ("data_dir", "relative/dir", "absolute path"),
        ("agent_settings", {"heartbeat_s": "5"}, "in capitals"),
    ],
)
async def test_the_bootstrap_refuses_bad_variables(
    tmp_path: Path, variable: str, value: Any, message: str
) -> None:
    with pytest.raises(AssertionError, match=message):
        await render(tmp_path, "agent-bootstrap", {**BASE, variable: value})


async def test_the_bootstrap_for_real_joins_a_node_to_the_fleet(
    database_url: str, tmp_path: Path
) -> None:
    """The script, rendered by terraform, run in a scratch root: it installs a wheel of this
    project (from a local wheelhouse: no SGLang, no driver), writes the agent's settings and
    starts it; the agent registers with a real control plane and runs its engines."""
    wheels = tmp_path / "wheels"
    await _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels),
               str(REPO))  # fmt: skip
    await _run(sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:",
               "-r", str(REPO / "requirements" / "main.lock"), "-d", str(wheels))  # fmt: skip
    (wheel,) = wheels.glob("meridian-*.whl")
    ports = {"us-east": free_port(), "us-west": free_port(), "eu-west": free_port()}
    cp = await start_server(database_url)
    root = tmp_path / "root"
    try:
        async with httpx.AsyncClient(base_url=cp.url, headers=ADMIN, timeout=30) as http:
            applied = await http.post("/v1/apply", content=fleet_document(ports, None),
                                      headers={"Content-Type": "application/yaml"})  # fmt: skip
            assert applied.status_code == 200, applied.text
            made = await http.post("/v1/bootstrap-tokens", json={"region": "us-west"})
            secret = tmp_path / "secret-store"
            secret.write_text(made.json()["token"] + "\n")
        out = await render(tmp_path / "tf", "agent-bootstrap", {
            "region": "us-west",
            "control_plane": cp.grpc_target,
            "bootstrap_token_command": f"cat {secret}",
            "operator_token_command": f"echo {OPERATOR}",
            "meridian_package": str(wheel),
            "sglang_package": "",
            "pip_args": f"--no-index --find-links {wheels}",
            "install_nvidia_driver": False,
            "port": ports["us-west"],
            "agent_settings": {"NODE": "us-west-1", "HOST": "127.0.0.1", "HEARTBEAT_S": "1"},
            "root": str(root),
        })  # fmt: skip
        script = tmp_path / "bootstrap.sh"
        script.write_text(out["script"])
        await _run("bash", str(script), timeout_s=300)
        agent = f"http://127.0.0.1:{ports['us-west']}"
        as_operator = {"Authorization": f"Bearer {OPERATOR}"}
        engines = sum(1 for d in yaml.safe_load(fleet_document(ports, None))["deployments"]
                      if d["region"] == "us-west")  # fmt: skip

        async def serving() -> dict[str, Any] | None:
            try:
                async with httpx.AsyncClient(timeout=5, headers=as_operator) as http:
                    answer = await http.get(f"{agent}/agent/status")
            except httpx.HTTPError:
                return None
            status: dict[str, Any] = answer.json()
            ready = [e for e in status["engines"] if e["state"] == "ready"]
            return status if status["revision"] and len(ready) == engines else None

        status = await eventually(serving, within_s=90)
        assert status["node"] == "us-west-1"
        assert status["source"] == "control-plane"

        async def acked() -> bool:  # acks reach the database in batches, every half second
            async with httpx.AsyncClient(base_url=cp.url, headers=ADMIN, timeout=30) as http:
                node = (await http.get("/v1/nodes/us-west-1")).json()
            return bool(node["status"]["applied_revision"] == status["revision"])

        await eventually(acked, within_s=10)
        unit = (root / "etc/systemd/system/meridian-agent.service").read_text()
        assert f"ExecStart={root}/opt/meridian/bin/meridian agent run" in unit
        assert (root / "etc/meridian/agent.env").stat().st_mode & 0o077 == 0  # owner only
    finally:
        pid_file = root / "etc/meridian/agent.pid"
        if pid_file.exists():
            await _stop(int(pid_file.read_text()))
        await stop_child(cp.process)


async def _run(*argv: str, timeout_s: float = 180) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode == 0, f"{' '.join(argv)}:\n{out.decode()[-5000:]}"
    return out.decode()


async def _stop(pid: int) -> None:
    """SIGTERM, as systemd would: the agent drains and stops its engines."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(300):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        await asyncio.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
