"""Terraform, run as an operator runs it, offline: providers only from the machine's plugin
directory (/opt/tf-plugins), never from a registry."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

TERRAFORM = Path(__file__).resolve().parents[2] / "terraform"
MODULES = TERRAFORM / "modules"
PLUGINS = Path("/opt/tf-plugins")


def terraform_binary() -> str:
    found = shutil.which("terraform")
    if found is None:
        pytest.fail("terraform is not installed (this image has it in /usr/local/bin)")
    return found


async def terraform(workdir: Path, *args: str, check: bool = True) -> tuple[int, str]:
    """`terraform ARGS` in `workdir`; its exit code and output."""
    config = workdir / ".terraformrc"
    await asyncio.to_thread(
        config.write_text,
        f'provider_installation {{\n  filesystem_mirror {{\n    path = "{PLUGINS}"\n  }}\n}}\n',
    )
    env = {**os.environ, "TF_CLI_CONFIG_FILE": str(config), "TF_IN_AUTOMATION": "1",
           "CHECKPOINT_DISABLE": "1", "TF_INPUT": "0"}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        terraform_binary(), f"-chdir={workdir}", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 300)
    text = out.decode()
    if check:
        assert proc.returncode == 0, f"terraform {' '.join(args)}:\n{text}"
    return proc.returncode or 0, text


async def render(workdir: Path, module: str, variables: dict[str, Any]) -> dict[str, Any]:
    """Apply a root module that only calls `module` (one that needs no provider) with
    `variables`; its outputs. The modules are copied beside the root module, so that their
    relative sources (../agent-bootstrap) resolve as they do for an operator."""
    root = workdir / "root"
    await asyncio.to_thread(_root_module, workdir, root, module, variables)
    await terraform(root, "init", "-input=false", "-no-color")
    await terraform(root, "apply", "-auto-approve", "-input=false", "-no-color")
    _, out = await terraform(root, "output", "-json", "all")
    rendered: dict[str, Any] = json.loads(out)
    return rendered


def _root_module(workdir: Path, root: Path, module: str, variables: dict[str, Any]) -> None:
    if not (workdir / "modules").exists():
        shutil.copytree(MODULES, workdir / "modules")
    root.mkdir(parents=True, exist_ok=True)
    (root / "main.tf").write_text(
        "".join(f'variable "{k}" {{}}\n' for k in variables)
        + f'module "under_test" {{\n  source = "../modules/{module}"\n'
        + "".join(f"  {k} = var.{k}\n" for k in variables)
        + "}\n"
        + 'output "all" {\n  value     = module.under_test\n  sensitive = true\n}\n'
    )
    (root / "terraform.tfvars.json").write_text(json.dumps(variables))


@dataclass(frozen=True)
class FakeClouds:
    """aws, gcloud and az on PATH, keeping their secrets under `store` (fake_clouds.py)."""

    bin: Path
    store: Path

    def env(self, **more: str) -> dict[str, str]:
        return {**os.environ, "PATH": f"{self.bin}:{os.environ['PATH']}",
                "FAKE_CLOUD_STORE": str(self.store), **more}  # fmt: skip

    def calls(self) -> str:
        log = self.store / "calls.log"
        return log.read_text() if log.exists() else ""


def fake_clouds(workdir: Path) -> FakeClouds:
    clouds = FakeClouds(workdir / "cloud-bin", workdir / "cloud-store")
    clouds.bin.mkdir(parents=True)
    clouds.store.mkdir(parents=True)
    script = Path(__file__).with_name("fake_clouds.py")
    for cli in ("aws", "gcloud", "az"):
        path = clouds.bin / cli
        path.write_text(f'#!/bin/sh\nexec {sys.executable} {script} {cli} "$@"\n')
        path.chmod(0o755)
    return clouds


CLOUDS = {"aws": {"provider": "aws"}, "gcp": {"provider": "gcp"}, "azure": {"provider": "azure"}}
REGIONS: list[dict[str, Any]] = [
    {"name": "us-east", "cloud": "aws", "geography": "us-east", "jurisdiction": "us",
     "gateway_url": "http://gpu-east-0123.elb.us-east-1.amazonaws.com:8500"},
    {"name": "eu-west", "cloud": "gcp", "geography": "eu-west", "jurisdiction": "eu",
     "gateway_url": "http://203.0.113.7:8500"},
    {"name": "us-west", "cloud": "azure", "geography": "us-west", "jurisdiction": "us",
     "gateway_url": "http://198.51.100.9:8500"},
]  # fmt: skip
