"""`meridian batches submit | list | show | cancel | output`: a tenant's batches, by HTTP, with
its API key (the control plane's API, or any agent's port: both serve the Batch API)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
import httpx
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from controlplane.client import fail

ENDED = ("completed", "failed", "expired", "cancelled")


class TenantSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MERIDIAN_", extra="ignore")

    url: str = "http://127.0.0.1:8400"
    api_key: SecretStr | None = None


@click.group("batches")
@click.option("--url", default=None, help="control plane or agent URL [$MERIDIAN_URL]")
@click.option("--api-key", default=None, help="a tenant's API key [$MERIDIAN_API_KEY]")
@click.pass_context
def batches(ctx: click.Context, url: str | None, api_key: str | None) -> None:
    """A tenant's batches: OpenAI's Batch API, run as the batch class on the regions' slack."""
    settings = TenantSettings()
    key = api_key or (settings.api_key.get_secret_value() if settings.api_key else None)
    if not key:
        raise click.UsageError("give --api-key or set MERIDIAN_API_KEY (a tenant's key)")
    ctx.obj = httpx.Client(base_url=(url or settings.url).rstrip("/"), timeout=120,
                           headers={"Authorization": f"Bearer {key}"})  # fmt: skip
    ctx.call_on_close(ctx.obj.close)


def _call(ctx: click.Context, method: str, path: str, **kwargs: Any) -> httpx.Response:
    client: httpx.Client = ctx.obj
    try:
        response = client.request(method, path, **kwargs)
    except httpx.HTTPError as error:
        raise click.ClickException(f"cannot reach {client.base_url}: {error}") from error
    if response.status_code != 200:
        fail(Console(), response)
    return response


@batches.command("submit")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--endpoint", default="/v1/chat/completions", show_default=True)
@click.option("--window", default="24h", show_default=True, help="completion window, 1h-168h")
@click.option("--wait/--no-wait", default=False, help="show its progress until it ends")
@click.pass_context
def submit_command(ctx: click.Context, file: Path, endpoint: str, window: str, wait: bool) -> None:
    """Upload FILE (JSONL, a request a line) and make a batch of it."""
    with file.open("rb") as handle:
        uploaded = _call(ctx, "POST", "/v1/files", data={"purpose": "batch"},
                         files={"file": (file.name, handle)}).json()  # fmt: skip
    made = _call(ctx, "POST", "/v1/batches", json={
        "input_file_id": uploaded["id"], "endpoint": endpoint, "completion_window": window,
    }).json()  # fmt: skip
    console = Console()
    console.print(f"batch {made['id']}: {made['request_counts']['total']} requests, "
                  f"{made['status']}", highlight=False)  # fmt: skip
    if wait:
        _follow(ctx, console, made)


def _follow(ctx: click.Context, console: Console, batch: dict[str, Any]) -> None:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=console) as progress:
        counts = batch["request_counts"]
        task = progress.add_task(batch["id"], total=counts["total"], failed=0)
        while batch["status"] not in ENDED:
            time.sleep(1)
            batch = _call(ctx, "GET", f"/v1/batches/{batch['id']}").json()
            counts = batch["request_counts"]
            progress.update(task, completed=counts["completed"] + counts["failed"],
                            failed=counts["failed"])  # fmt: skip
    console.print(f"{batch['id']}: {batch['status']}; output {batch['output_file_id']}, "
                  f"errors {batch['error_file_id']}", highlight=False)  # fmt: skip


@batches.command("list")
@click.option("--limit", type=click.IntRange(1, 100), default=20, show_default=True)
@click.pass_context
def list_command(ctx: click.Context, limit: int) -> None:
    """The tenant's batches, newest first."""
    table = Table("batch", "status", "total", "completed", "failed", "created")
    for b in _call(ctx, "GET", "/v1/batches", params={"limit": limit}).json()["data"]:
        counts = b["request_counts"]
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(b["created_at"]))
        table.add_row(b["id"], b["status"], str(counts["total"]), str(counts["completed"]),
                      str(counts["failed"]), created)  # fmt: skip
    Console().print(table)


@batches.command("show")
@click.argument("batch")
@click.option("--wait/--no-wait", default=False, help="show its progress until it ends")
@click.pass_context
def show_command(ctx: click.Context, batch: str, wait: bool) -> None:
    """One batch: its status, counts and files."""
    doc = _call(ctx, "GET", f"/v1/batches/{batch}").json()
    console = Console()
    if wait:
        _follow(ctx, console, doc)
        return
    counts = doc["request_counts"]
    console.print(f"{doc['id']}: {doc['status']}; {counts['completed']} of {counts['total']} "
                  f"answered, {counts['failed']} failed; output {doc['output_file_id']}, "
                  f"errors {doc['error_file_id']}", highlight=False)  # fmt: skip


@batches.command("cancel")
@click.argument("batch")
@click.pass_context
def cancel_command(ctx: click.Context, batch: str) -> None:
    """No request of it not yet sent is sent."""
    doc = _call(ctx, "POST", f"/v1/batches/{batch}/cancel").json()
    Console().print(f"{doc['id']}: {doc['status']}", highlight=False)


@batches.command("output")
@click.argument("batch")
@click.option("--errors", is_flag=True, help="its error file instead")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.pass_context
def output_command(ctx: click.Context, batch: str, errors: bool, out: Path) -> None:
    """Write a batch's output (or error) file to OUT."""
    doc = _call(ctx, "GET", f"/v1/batches/{batch}").json()
    file = doc["error_file_id" if errors else "output_file_id"]
    if file is None:
        raise click.ClickException(f"{batch} has no {'error' if errors else 'output'} file "
                                   f"({doc['status']})")  # fmt: skip
    out.write_bytes(_call(ctx, "GET", f"/v1/files/{file}/content").content)
    Console().print(f"{out}: {out.stat().st_size} bytes", highlight=False)
