"""`meridian rollout status | pause | resume | promote | abort`: the newest rollout, by HTTP."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table

from controlplane.client import call, connect

MARKS = {"pass": "[green]pass[/]", "fail": "[red]FAIL[/]", "wait": "[yellow]wait[/]"}


@click.group("rollout")
@click.option("--url", default=None, help="control plane URL [$MERIDIAN_URL]")
@click.option("--token", default=None, help="bearer token [$MERIDIAN_TOKEN]")
@click.pass_context
def rollout(ctx: click.Context, url: str | None, token: str | None) -> None:
    """Watch and steer how a change reaches the fleet."""
    connect(ctx, url, token)


@rollout.command("status")
@click.pass_context
def status_command(ctx: click.Context) -> None:
    """Declared and in force, the newest rollout's waves and checks, what each target holds."""
    show(Console(), call(ctx, "GET", "/v1/rollouts"))


def _action(name: str, help_text: str) -> click.Command:
    @click.pass_context
    def run(ctx: click.Context, /, **flags: bool) -> None:
        params = {"everywhere": "true"} if flags.get("everywhere") else {}
        show(Console(), call(ctx, "POST", f"/v1/rollouts/current/{name}", **params))

    command = click.Command(name, callback=run, help=help_text)
    if name == "promote":
        command.params.append(
            click.Option(["--everywhere"], is_flag=True, help="every target at once")
        )
    return command


for _name, _help in (
    ("pause", "Hold the rollout at its wave (checks still run; a failed one still rolls back)."),
    ("resume", "Go on from the wave it holds; the wave's watch begins again."),
    ("promote", "The next wave now, without its bake and checks (--everywhere: every target)."),
    ("abort", "Roll back every target to the last good revision."),
):
    rollout.add_command(_action(_name, _help))


def show(console: Console, doc: dict[str, Any]) -> None:
    in_force = doc["in_force"]
    console.print(
        f"declared: revision {doc['declared_revision']} (intent {doc['declared_intent']}); "
        f"in force: intent {in_force['intent']}: {in_force['why']}",
        highlight=False,
    )
    row = doc.get("rollout")
    if row is None:
        console.print("no rollout yet")
        return
    console.print(
        f"rollout {row['id']} of revision {row['revision']} from {row['base']}: "
        f"[bold]{row['state']}[/] {row['reason']}",
        highlight=False,
    )
    waves = Table("wave", "targets", "judged models", "bake", "status")
    for wave in row["waves"]:
        models = wave.get("models")
        judged = "all" if models is None else ", ".join(models) or "none"
        waves.add_row(wave["name"], ", ".join(wave["targets"]), judged,
                      f"{wave['bake_s']:g} s", wave["status"])  # fmt: skip
    console.print(waves)
    if row["checks"]:
        checks = Table("check", "model", "verdict", "figure")
        for check in row["checks"]:
            verdict = MARKS.get(check["verdict"], check["verdict"])
            checks.add_row(check["check"], check.get("model") or "", verdict, check["figure"])
        console.print(checks)
    targets = Table("region", "holds", "nodes (holds / applied revision)")
    for target in doc["targets"]:
        nodes = ", ".join(f"{n['name']} ({n['holds']} / {n['applied_revision']})"
                          for n in target["nodes"])  # fmt: skip
        targets.add_row(target["region"], str(target["holds"]), nodes)
    console.print(targets)
