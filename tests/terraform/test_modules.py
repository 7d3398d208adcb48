"""Each module that needs a provider this machine has (/opt/tf-plugins: AWS) is initialised
offline from that directory, validated, and planned by its own `terraform test` files with the
provider mocked: no account, no network."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from tests.terraform.kit import MODULES, terraform

WITH_PROVIDER = ["nodepool-aws"]


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
