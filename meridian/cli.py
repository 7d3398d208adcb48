"""The `meridian` command: one entry point for the control plane, the agents and operators.

Subcommands are imported when called, so that `meridian sim` and `meridian agent run` start
in half a second without loading the control plane's libraries.
"""

from __future__ import annotations

import importlib

import click

COMMANDS = {
    "controlplane": ("controlplane.cli", "controlplane", "Run and manage the control plane."),
    "apply": ("controlplane.client", "apply_command", "Apply a fleet document."),
    "rollout": ("controlplane.rollout_cli", "rollout", "Watch, pause, promote or abort a rollout."),
    "planner": ("controlplane.planner_cli", "planner", "Watch, pause or resume the planner."),
    "batches": ("controlplane.batch_cli", "batches", "A tenant's batches: submit, follow, fetch."),
    "usage": ("controlplane.usage_cli", "usage", "What tenants used and its cost; its export."),
    "keys": ("controlplane.keys_cli", "keys", "Rotate signing keys and the KEK; rewrap."),
    "login": ("controlplane.login_cli", "login_command", "Sign in through the identity provider."),
    "logout": ("controlplane.login_cli", "logout_command", "Forget the sign-in."),
    "join": ("meridian.join", "join_command", "Join Terraform's pools to the fleet (tokens)."),
    "up": ("meridian.up", "up_command", "Run a whole local fleet."),
    "demo": ("meridian.demo", "demo", "Show the local fleet at work (sample traffic, live)."),
    "bench": ("bench.cli", "bench", "Run benchmarks."),
    "agent": ("agents.cli", "agent", "Run a node agent."),
    "sim": ("agents.engines.sim.cli", "sim_command", "Serve a simulated SGLang engine."),
    "engines": ("agents.engines.cli", "engines", "The real SGLang: its environment, a tiny model."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attribute, _ = COMMANDS[cmd_name]
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup)
@click.version_option(package_name="meridian")
def main() -> None:
    """Meridian: a control plane for LLM inference across regions and clouds."""
