"""`meridian usage` (the ledger's sums, as GET /v1/usage gives them) and `meridian usage
export` (its raw records of a period, as JSON lines or CSV)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, date, datetime, time
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click
import httpx
import orjson
from rich.console import Console
from rich.table import Table

from controlplane.client import call, connect, fail

WIDTHS = {"hour": "1h", "day": "1d", "month": "1mo"}
FIGURES = ("num_model_requests", "num_refused_requests", "input_tokens", "input_cached_tokens",
           "output_tokens")  # fmt: skip


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise click.BadParameter(f"no time zone named {name!r}", param_hint="--tz") from None


def _instant(value: str, zone: ZoneInfo, option: str) -> int:
    """A date (its midnight where `zone` says) or an ISO time, as Unix seconds."""
    try:
        if len(value) == 10:
            at = datetime.combine(date.fromisoformat(value), time(), tzinfo=zone)
        else:
            at = datetime.fromisoformat(value)
            at = at if at.tzinfo is not None else at.replace(tzinfo=zone)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither a date (2026-11-01) nor a time (2026-11-01T12:00)",
            param_hint=option,
        ) from None
    return int(at.timestamp())


Params = dict[str, str | int]


def _period(since: str, until: str | None, tz: str) -> Params:
    zone = _zone(tz)
    params: Params = {"start_time": _instant(since, zone, "--since")}
    if until is not None:
        params["end_time"] = _instant(until, zone, "--until")
    return params


def _filters(tenant: tuple[str, ...], model: tuple[str, ...], region: tuple[str, ...],
             key: tuple[str, ...]) -> dict[str, str]:  # fmt: skip
    given = {"tenants": tenant, "models": model, "regions": region, "api_keys": key}
    return {name: ",".join(values) for name, values in given.items() if values}


FILTERS = [
    click.option("--tenant", multiple=True, help="only this tenant's (repeat for more)"),
    click.option("--model", multiple=True, help="only this model's"),
    click.option("--region", multiple=True, help="only this region's"),
    click.option("--key", multiple=True, help="only this API key's (its prefix)"),
]


def _with_filters(command: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(FILTERS):
        command = option(command)
    return command


@click.group("usage", invoke_without_command=True)
@click.option("--since", default=None, help="a date (its midnight in --tz) or an ISO time; "
              "default: the first of this month")  # fmt: skip
@click.option("--until", default=None, help="exclusive; default: now")
@click.option("--by", default="tenant", show_default=True, help="comma-separated: tenant, "
              "api_key, model, region, service_class; or none")  # fmt: skip
@click.option("--bucket", type=click.Choice(list(WIDTHS)), default="day", show_default=True)
@click.option("--tz", default="UTC", show_default=True, help="where a day and a month begin")
@click.option("--json", "as_json", is_flag=True, help="the API's answer, as it is")
@_with_filters
@click.option("--url", default=None, help="control plane URL [$MERIDIAN_URL]")
@click.option("--token", default=None, help="bearer token [$MERIDIAN_TOKEN]")
@click.pass_context
def usage(ctx: click.Context, since: str | None, until: str | None, by: str, bucket: str,
          tz: str, as_json: bool, tenant: tuple[str, ...], model: tuple[str, ...],
          region: tuple[str, ...], key: tuple[str, ...], url: str | None,
          token: str | None) -> None:  # fmt: skip
    """What each tenant used and what it costs, from the usage ledger."""
    connect(ctx, url, token)
    if ctx.invoked_subcommand is not None:
        return
    if since is None:
        since = datetime.now(_zone(tz)).date().replace(day=1).isoformat()
    params = _period(since, until, tz) | _filters(tenant, model, region, key)
    params |= {"bucket_width": WIDTHS[bucket], "time_zone": tz}
    if by != "none":
        params["group_by"] = by
    pages, page = [], None
    while True:
        doc = call(ctx, "GET", "/v1/usage", **params, **({"page": page} if page else {}))
        pages.append(doc)
        page = doc.get("next_page")
        if not page:
            break
    if as_json:
        click.echo(_joined(pages))
        return
    _print(pages, [g for g in by.split(",") if g and by != "none"], _zone(tz), bucket)


def _joined(pages: list[dict[str, object]]) -> str:
    data = [b for p in pages for b in p["data"]]  # type: ignore[attr-defined]
    return orjson.dumps({**pages[-1], "data": data}, option=orjson.OPT_INDENT_2).decode()


def _print(pages: list[dict[str, object]], groups: list[str], zone: ZoneInfo, bucket: str) -> None:
    currency = str(pages[0]["currency"])
    table = Table(bucket, *groups, "requests", "refused", "input", "cached", "output",
                  f"cost ({currency})")  # fmt: skip
    total = [0, 0, 0, 0, 0, 0]
    form = {"hour": "%Y-%m-%d %H:00", "day": "%Y-%m-%d", "month": "%Y-%m"}[bucket]
    for doc in pages:
        for b in doc["data"]:  # type: ignore[attr-defined]
            start = datetime.fromtimestamp(b["start_time"], UTC).astimezone(zone).strftime(form)
            for r in b["results"]:
                figures = [r[f] for f in FIGURES] + [r["cost"]["nanos"]]
                total = [t + f for t, f in zip(total, figures, strict=True)]
                table.add_row(
                    start,
                    *(str(r[g]) for g in groups),
                    *(f"{f:,}" for f in figures[:5]),
                    f"{figures[5] / 1e9:,.6f}",
                )
    table.add_section()
    table.add_row("total", *("" for _ in groups), *(f"{f:,}" for f in total[:5]),
                  f"{total[5] / 1e9:,.6f}")  # fmt: skip
    Console().print(table)


@usage.command("export")
@click.option("--since", required=True, help="a date (its midnight in --tz) or an ISO time")
@click.option("--until", default=None, help="exclusive; default: now")
@click.option("--tz", default="UTC", show_default=True)
@click.option("--format", "form", type=click.Choice(["jsonl", "csv"]), default="jsonl",
              show_default=True)  # fmt: skip
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="a file; default: standard output")  # fmt: skip
@_with_filters
@click.pass_context
def export_command(ctx: click.Context, since: str, until: str | None, tz: str, form: str,
                   out: Path | None, tenant: tuple[str, ...], model: tuple[str, ...],
                   region: tuple[str, ...], key: tuple[str, ...]) -> None:  # fmt: skip
    """Every usage record of a period, oldest first, as JSON lines or CSV."""
    base, secret = ctx.obj
    params = _period(since, until, tz) | _filters(tenant, model, region, key) | {"format": form}
    sink = out.open("wb") if out is not None else sys.stdout.buffer
    try:
        with httpx.stream("GET", f"{base}/v1/usage/records", params=params, timeout=300,
                          headers={"Authorization": f"Bearer {secret}"}) as answer:  # fmt: skip
            if answer.status_code != 200:
                answer.read()
                fail(Console(stderr=True), answer)
            for chunk in answer.iter_bytes():
                sink.write(chunk)
    except httpx.HTTPError as error:
        raise click.ClickException(f"cannot reach {base}: {error}") from error
    finally:
        if out is not None:
            sink.close()


@usage.command("reconcile")
@click.option("--since", default=None, help="a date (its midnight in --tz) or an ISO time; "
              "default: a day ago")  # fmt: skip
@click.option("--until", default=None, help="exclusive; default: now")
@click.option("--tz", default="UTC", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="the API's answer, as it is")
@click.pass_context
def reconcile_command(ctx: click.Context, since: str | None, until: str | None, tz: str,
                      as_json: bool) -> None:  # fmt: skip
    """The ledger's tokens per engine against the engines' own counters, and the drift."""
    params: Params = _period(since, until, tz) if since is not None else {}
    if since is None and until is not None:
        params = {"end_time": _period(until, None, tz)["start_time"]}
    doc = call(ctx, "GET", "/v1/usage/reconciliation", **params)
    if as_json:
        click.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
        return
    table = Table("engine", "metered from", "until", "requests", "engine prompt", "ledger prompt",
                  "drift", "engine output", "ledger output", "drift")  # fmt: skip
    for e in doc["engines"]:
        engine, ledger, drift = e["engine"], e["ledger"], e["drift"]
        row = [e["worker"], e["from"][:19], e["until"][:19], f"{ledger['requests']:,}"]
        for tokens in ("prompt_tokens", "completion_tokens"):
            row += [f"{engine[tokens]:,}", f"{ledger[tokens]:,}", f"{drift[tokens]:+.3%}"]
        table.add_row(*row)
    Console().print(table)
