"""The `meridian` command: one entry point for the control plane, the agents and operators."""

from __future__ import annotations

import click

from bench.cli import bench
from controlplane.cli import controlplane
from controlplane.client import apply_command
from meridian.up import up_command


@click.group()
@click.version_option(package_name="meridian")
def main() -> None:
    """Meridian: a control plane for LLM inference across regions and clouds."""


main.add_command(controlplane)
main.add_command(apply_command)
main.add_command(up_command)
main.add_command(bench)
