"""`meridian planner status | plan | pause | resume`: the capacity planner, by HTTP."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table

from controlplane.client import call, connect


@click.group("planner")
@click.option("--url", default=None, help="control plane URL [$MERIDIAN_URL]")
@click.option("--token", default=None, help="bearer token [$MERIDIAN_TOKEN]")
@click.pass_context
def planner(ctx: click.Context, url: str | None, token: str | None) -> None:
    """Watch and steer the capacity planner (deployments with `autoscale`)."""
    connect(ctx, url, token)


@planner.command("status")
@click.pass_context
def status_command(ctx: click.Context) -> None:
    """Its mode, whether it is paused, its guard rails, and its last plan in short."""
    doc = call(ctx, "GET", "/v1/planner")
    console = Console()
    header(console, doc)
    changes = [d for d in doc["decisions"] if d["target"] != d["engines"]]
    console.print(f"{len(doc['decisions'])} deployment(s) planned; "
                  f"{len(changes)} change(s) last period", highlight=False)  # fmt: skip
    for d in changes:
        console.print(f"  {d['summary']}", highlight=False)


@planner.command("plan")
@click.pass_context
def plan_command(ctx: click.Context) -> None:
    """Every deployment it sizes: engines now and planned, demand, forecast, and why."""
    doc = call(ctx, "GET", "/v1/planner")
    console = Console()
    header(console, doc)
    table(console, doc["decisions"])


def _action(name: str, help_text: str) -> click.Command:
    @click.pass_context
    def run(ctx: click.Context, /) -> None:
        header(Console(), call(ctx, "POST", f"/v1/planner/{name}"))

    return click.Command(name, callback=run, help=help_text)


for _name, _help in (
    ("pause", "Plans become advice: audited and shown, and nothing changes."),
    ("resume", "Act on its plans again, from its next period."),
):
    planner.add_command(_action(_name, _help))


def header(console: Console, doc: dict[str, Any]) -> None:
    paused = f"[yellow]paused[/] by {doc['paused_by']}" if doc["paused"] else "running"
    budgets = [
        f"{doc['gpu_budget']} GPUs" if doc["gpu_budget"] is not None else "",
        f"{doc['money_budget']:g} an hour" if doc["money_budget"] is not None else "",
    ]
    budget = " and ".join(b for b in budgets if b) or "none"
    console.print(
        f"mode {doc['mode']}, {paused}; every {doc['period_s']:g} s, cool-down "
        f"{doc['cooldown_s']:g} s, at most {doc['max_changes']} changes a period, budget "
        f"{budget}; last plan {doc['last_run_at'] or 'never'}"
    )  # fmt: skip


def table(console: Console, decisions: list[dict[str, Any]]) -> None:
    out = Table("deployment", "region", "engines", "planned", "rps", "forecast", "SLO met",
                "why")  # fmt: skip
    for d in decisions:
        planned = str(d["target"]) + ("" if d["taken"] else " (held)")
        met = f"{d['attainment']:.0%}" if d.get("attainment") is not None else "-"
        rate = f"{d['rate_rps']:.1f}" if d.get("rate_rps") is not None else "-"
        out.add_row(d["deployment"], d["region"], str(d["engines"]), planned, rate,
                    f"{d['forecast_rps']:.1f}", met, d["reason"])  # fmt: skip
    console.print(out)
