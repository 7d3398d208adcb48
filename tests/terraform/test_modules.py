"""Each module that needs a provider this machine has (/opt/tf-plugins: AWS) is initialised
offline from that directory, validated, and planned by its own `terraform test` files with the
provider mocked: no account, no network."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.terraform.kit import MODULES, render, terraform

WITH_PROVIDER = ["controlplane-aws", "nodepool-aws"]


@pytest.mark.parametrize("module", WITH_PROVIDER)
async def test_the_module_validates_and_its_plan_tests_pass(tmp_path: Path, module: str) -> None:
    # A copy, so that .terraform and lock files stay out of the repository; the modules
    # beside it come along, for the relative sources.
    copy = tmp_path / "modules"
    await asyncio.to_thread(shutil.copytree, MODULES, copy)
    here = copy / module
    await terraform(here, "init", "-input=false", "-no-color", "-backend=false")
    await terraform(here, "validate", "-no-color")
    _, out = await terraform(here, "test", "-no-color")
    assert "0 failed" in out, out
    assert " passed" in out


def test_every_module_with_a_provider_is_tested() -> None:
    with_tests = sorted(p.parent.parent.name for p in MODULES.glob("*/tests/*.tftest.hcl"))
    assert sorted(set(with_tests)) == sorted(WITH_PROVIDER)


# The GCP and Azure providers are not on this machine: those modules are checked by what needs
# no provider, their variables' validation, in a root module of their variables alone.
GOOD: dict[str, dict[str, Any]] = {
    "nodepool-gcp": {
        "name": "gpu-eu", "region": "eu-west", "project": "meridian-prod",
        "zone": "europe-west4-a", "network": "default", "subnetwork": "default",
        "machine_type": "a3-highgpu-8g", "gpus_per_node": 8, "image": "projects/x/global/images/y",
        "control_plane": "cp.example.com:8401",
        "bootstrap_token_secret": "projects/meridian-prod/secrets/bootstrap-eu-west",
        "client_cidrs": ["0.0.0.0/0"],
    },
    "nodepool-azure": {
        "name": "gpu-us", "region": "us-west", "resource_group_name": "meridian",
        "location": "westus3", "subnet_id": "/subscriptions/s/resourceGroups/r/x",
        "vm_size": "Standard_ND96isr_H100_v5", "gpus_per_node": 8,
        "image": {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204",
                  "version": "latest"},
        "admin_ssh_key": "ssh-ed25519 AAAA meridian", "control_plane": "cp.example.com:8401",
        "key_vault_name": "meridian-kv", "key_vault_id": "/subscriptions/s/x/vaults/meridian-kv",
        "bootstrap_token_secret_name": "bootstrap-us-west", "client_cidrs": ["0.0.0.0/0"],
    },
}  # fmt: skip
BAD = [
    ("nodepool-gcp", "machine_type", "n2-standard-8", "accelerator-optimized"),
    ("nodepool-gcp", "zone", "europe-west4", "must be a GCP zone"),
    ("nodepool-gcp", "bootstrap_token_secret", "mb-123.token", "projects/PROJECT/secrets/NAME"),
    ("nodepool-azure", "vm_size", "Standard_D4s_v5", "N-series GPU size"),
    ("nodepool-azure", "zones", ["4"], "zones are"),
]


async def _variables_only(tmp_path: Path, module: str, values: dict[str, Any]) -> tuple[int, str]:
    def prepare() -> None:
        tmp_path.mkdir(parents=True, exist_ok=True)
        shutil.copy(MODULES / module / "variables.tf", tmp_path / "variables.tf")
        (tmp_path / "terraform.tfvars.json").write_text(json.dumps(values))

    await asyncio.to_thread(prepare)
    await terraform(tmp_path, "init", "-input=false", "-no-color")
    return await terraform(tmp_path, "plan", "-input=false", "-no-color", check=False)


@pytest.mark.parametrize("module", sorted(GOOD))
async def test_a_pool_without_its_provider_here_takes_good_variables(
    tmp_path: Path, module: str
) -> None:
    code, out = await _variables_only(tmp_path, module, GOOD[module])
    assert code == 0, out


@pytest.mark.parametrize(("module", "variable", "value", "message"), BAD)
async def test_a_pool_without_its_provider_here_refuses_bad_variables(
    tmp_path: Path, module: str, variable: str, value: Any, message: str
) -> None:
    code, out = await _variables_only(tmp_path, module, {**GOOD[module], variable: value})
    assert code != 0
    assert message in " ".join(out.split()), out


# What every cloud's pool takes alike is validated once, by pool-common, which needs no
# provider: rendered here with each bad value.
COMMON: dict[str, Any] = {
    "region": "us-east", "gpus_per_node": 8, "node_count": 2, "gateway_port": 8500,
    "client_cidrs": ["10.0.0.0/8"], "control_plane": "cp.example.com:8401",
    "control_plane_tls": True, "bootstrap_token_command": "cat /run/secrets/token",
    "meridian_package": "meridian", "sglang_package": "sglang[all]",
}  # fmt: skip


async def test_what_every_pool_takes_alike_is_validated_once(tmp_path: Path) -> None:
    out = await render(tmp_path, "pool-common", COMMON)
    assert out["gpus"] == 16
    assert "'MERIDIAN_AGENT_REGION' 'us-east'" in out["script"]
    assert out["node_pool"] is None  # no price: the operator sizes it


PRICED = {**COMMON, "pool_name": "east-h100", "price_per_gpu_hour": 3.9, "gpu_model": "H100",
          "spot": True, "group": "us-east-1/east-h100-nodes",
          "bootstrap_token_store": {"kind": "gcp-secret-manager",
                                    "secret": "projects/p/secrets/bt"}}  # fmt: skip


async def test_a_priced_pool_is_the_fleets_node_pool(tmp_path: Path) -> None:
    pool = (await render(tmp_path, "pool-common", PRICED))["node_pool"]
    assert {k: v for k, v in pool.items() if k != "bootstrap_token_store"} == {
        "name": "east-h100", "region": "us-east", "gpu_model": "H100", "gpus_per_node": 8,
        "price_per_gpu_hour": 3.9, "spot": True, "min_nodes": 0, "max_nodes": 2,
        "group": "us-east-1/east-h100-nodes"}  # fmt: skip
    assert pool["bootstrap_token_store"]["secret"] == "projects/p/secrets/bt"


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("gpus_per_node", 0, "from 1 to 16"),
        ("node_count", 1.5, "whole number"),
        ("client_cidrs", ["everyone"], "CIDR block"),
        ("client_cidrs", [], "CIDR block"),
        ("region", "us east", "region must be"),
        ("gateway_port", 80, "from 1024 to 65535"),
        ("price_per_gpu_hour", -1, "0 or more"),
    ],
)
async def test_what_every_pool_takes_alike_refuses_bad_values(
    tmp_path: Path, variable: str, value: Any, message: str
) -> None:
    with pytest.raises(AssertionError, match=message):
        await render(tmp_path, "pool-common", {**COMMON, variable: value})


async def test_a_priced_pool_without_its_gpu_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="needs its gpu_model"):
        await render(tmp_path, "pool-common", {**PRICED, "gpu_model": None})
