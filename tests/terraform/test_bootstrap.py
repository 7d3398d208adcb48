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
from tests.kits.controlplane import ADMIN_TOKEN, run_cli, start_server
from tests.kits.fleet import OPERATOR, fleet_document
from tests.kits.push import ADMIN, eventually
from tests.terraform.kit import TERRAFORM, fake_clouds, render, terraform

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
    assert f"cat {TOKEN_FILE}" in script  # the agent reads the token when it registers
    assert "BOOTSTRAP_TOKEN=" not in script.replace("BOOTSTRAP_TOKEN_COMMAND=", "")
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


GCP_SECRET = "projects/meridian-test/secrets/bootstrap-us-west"
ADMIN_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:meridian/admin-token"


# It downloads the locked wheels from PyPI: it runs in the machine's own network namespace
# (the parallel workers' namespaces reach nothing beyond themselves), beside them.
@pytest.mark.network
async def test_the_operator_path_from_terraform_to_a_serving_node(
    database_url: str, tmp_path: Path
) -> None:
    """What an operator does after `terraform apply`, with only the clouds' secret stores
    faked (their CLIs, fake_clouds.py):

    - a pool machine boots with the bootstrap script, rendered by terraform; it installs a
      wheel of this project (from a local wheelhouse: no SGLang, no driver) and starts the
      agent, which waits, since no bootstrap token is in the secret store yet;
    - `meridian join -f` takes fleet-document's `join` output: it reads the admin token from
      the control plane's store, applies the regions, and puts a fresh token in the pool's
      store, never on a command line;
    - the agent picks the token up, registers with the real control plane and runs its
      engines once the models and deployments are applied."""
    wheels = tmp_path / "wheels"
    await _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels),
               str(REPO))  # fmt: skip
    await _run(sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:",
               "-r", str(REPO / "requirements" / "main.lock"), "-d", str(wheels))  # fmt: skip
    (wheel,) = wheels.glob("meridian-*.whl")
    clouds = fake_clouds(tmp_path)
    ports = {"us-east": free_port(), "us-west": free_port(), "eu-west": free_port()}
    fleet = yaml.safe_load(fleet_document(ports, None))
    cp = await start_server(database_url)
    root = tmp_path / "root"
    try:
        # what controlplane-aws made: the admin token in Secrets Manager
        admin = tmp_path / "admin-token"
        admin.write_text(ADMIN["Authorization"].removeprefix("Bearer "))
        await _run("aws", "secretsmanager", "put-secret-value", "--region", "us-east-1",
                   "--secret-id", ADMIN_SECRET, "--secret-string", f"file://{admin}",
                   env=clouds.env())  # fmt: skip
        admin.unlink()
        out = await render(tmp_path / "tf", "agent-bootstrap", {
            "region": "us-west",
            "control_plane": cp.grpc_target,
            # what nodepool-gcp gives it
            "bootstrap_token_command": f"gcloud secrets versions access latest "
                                       f"--secret={GCP_SECRET}",
            "operator_token_command": f"echo {OPERATOR}",
            "meridian_package": str(wheel),
            "sglang_package": "",
            "pip_args": f"--no-index --find-links {wheels}",
            "install_nvidia_driver": False,
            "port": ports["us-west"],
            "agent_settings": {"NODE": "us-west-1", "HOST": "127.0.0.1", "HEARTBEAT_S": "1",
                               "RECONNECT_MAX_S": "2"},
            "root": str(root),
        })  # fmt: skip
        script = tmp_path / "bootstrap.sh"
        script.write_text(out["script"])
        await _run("bash", str(script), timeout_s=300, env=clouds.env())
        agent = f"http://127.0.0.1:{ports['us-west']}"
        as_operator = {"Authorization": f"Bearer {OPERATOR}"}

        async def status() -> dict[str, Any] | None:
            try:
                async with httpx.AsyncClient(timeout=5, headers=as_operator) as http:
                    answer = await http.get(f"{agent}/agent/status")
            except httpx.HTTPError:
                return None
            if answer.status_code != 200:  # not the agent's status (yet)
                return None
            found: dict[str, Any] = answer.json()
            return found if "control_plane" in found else None

        async def waiting() -> str | None:
            now = await status()
            return (now["control_plane"]["last_error"] or None) if now else None

        # booted before the operator made its token: it waits, and says why
        said = await eventually(waiting, within_s=60)
        assert "bootstrap token command exited 1" in said
        assert "NOT_FOUND" in said

        rendered = await render(tmp_path / "doc", "fleet-document", {
            "clouds": {c["name"]: {"provider": c["provider"], "description": c["description"]}
                       for c in fleet["clouds"]},
            "regions": [{**{k: r[k] for k in ("name", "cloud", "geography", "jurisdiction",
                                             "gateway_url")},
                         "bootstrap_token_store": {"kind": "gcp-secret-manager",
                                                   "secret": GCP_SECRET}}
                        if r["name"] == "us-west" else
                        {k: r[k] for k in ("name", "cloud", "geography", "jurisdiction",
                                           "gateway_url")}
                        for r in fleet["regions"]],
            "api_url": cp.url,
            "admin_token_store": {"kind": "aws-secretsmanager", "region": "us-east-1",
                                  "secret": ADMIN_SECRET},
        })  # fmt: skip
        join = tmp_path / "join.json"
        join.write_text(rendered["join"])
        own = tmp_path / "serving.yaml"  # the operator's own: models, nodes, deployments
        own.write_text(yaml.safe_dump(fleet))
        without_token = clouds.env(MERIDIAN_TOKEN="", COLUMNS="200")
        code, said = await run_cli("join", "-f", str(join), "--apply", str(own),
                                   env=without_token)  # fmt: skip
        assert code == 0, said
        assert "+ region us-west" in said
        assert "+ cloud gcp" in said
        assert "+ deployment llama-us-west" in said
        assert "gcp-secret-manager" in said
        assert GCP_SECRET in said
        engines = sum(1 for d in fleet["deployments"] if d["region"] == "us-west")

        async def serving() -> dict[str, Any] | None:
            now = await status()
            if now is None:
                return None
            ready = [e for e in now["engines"] if e["state"] == "ready"]
            return now if now["revision"] and len(ready) == engines else None

        served = await eventually(serving, within_s=90)
        assert served["node"] == "us-west-1"
        assert served["source"] == "control-plane"

        async def acked() -> bool:  # acks reach the database in batches, every half second
            async with httpx.AsyncClient(base_url=cp.url, headers=ADMIN, timeout=30) as http:
                node = (await http.get("/v1/nodes/us-west-1")).json()
            return bool(node["status"]["applied_revision"] == served["revision"])

        await eventually(acked, within_s=10)
        unit = (root / "etc/systemd/system/meridian-agent.service").read_text()
        assert f"ExecStart={root}/opt/meridian/bin/meridian agent run" in unit
        settings = (root / "etc/meridian/agent.env").read_text()
        assert (root / "etc/meridian/agent.env").stat().st_mode & 0o077 == 0  # owner only
        (token_file,) = clouds.store.glob("gcp-*")
        token = token_file.read_text()
        assert token.startswith("mb")
        assert token not in settings
        assert token not in clouds.calls()
        assert ADMIN_TOKEN not in clouds.calls()

        # run again before the tokens lapse: nothing to apply, a fresh token for the pool
        code, said = await run_cli("join", "-f", str(join), env=without_token)
        assert code == 0, said
        assert "no changes" in said
        assert token_file.read_text() != token
        async with httpx.AsyncClient(base_url=cp.url, headers=ADMIN, timeout=30) as http:
            tokens = (await http.get("/v1/bootstrap-tokens")).json()["items"]
        assert [t["region"] for t in tokens] == ["us-west", "us-west"]
    finally:
        pid_file = root / "etc/meridian/agent.pid"
        if pid_file.exists():
            await _stop(int(pid_file.read_text()))
        await stop_child(cp.process)


async def _run(*argv: str, timeout_s: float = 180, env: dict[str, str] | None = None) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env
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
