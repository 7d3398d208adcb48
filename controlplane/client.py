"""The admin API from the command line: `meridian apply` and friends speak HTTP only."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

import click
import httpx
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from rich.console import Console

from controlplane.credentials import stored_token


class ClientSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MERIDIAN_", extra="ignore")

    url: str = "http://127.0.0.1:8400"
    token: SecretStr | None = None


def fail(console: Console, response: httpx.Response) -> NoReturn:
    try:
        body = response.json()
    except ValueError:
        body = {"detail": response.text}
    console.print(
        f"[red]error {response.status_code} {body.get('code', '')}[/]: {body.get('detail', '')}"
    )
    for err in body.get("errors", []):
        console.print(f"  [red]{err.get('field')}[/]: {err.get('message')}")
    for dep in body.get("dependents", []):
        console.print(f"  used by {dep}")
    sys.exit(1)


def credentials(url: str | None, token: str | None) -> tuple[str, str]:
    """The control plane's URL and the bearer token to send it: --token, else $MERIDIAN_TOKEN,
    else the sign-in of `meridian login` there."""
    settings = ClientSettings()
    url = (url or settings.url).rstrip("/")
    secret = token or (settings.token.get_secret_value() if settings.token else None)
    secret = secret or stored_token(url)
    if not secret:
        raise click.UsageError(f"give --token, set MERIDIAN_TOKEN, or sign in to {url} with "
                               "`meridian login`")  # fmt: skip
    return url, secret


def connect(ctx: click.Context, url: str | None, token: str | None) -> None:
    """A command group's --url and --token (or what `credentials` finds), kept for its
    commands."""
    ctx.obj = credentials(url, token)


def call(
    ctx: click.Context, method: str, path: str, payload: Any = None, **params: Any
) -> dict[str, Any]:
    """The admin API's JSON answer; a problem's detail, and exit 1, when it refuses."""
    url, token = ctx.obj
    try:
        response = httpx.request(method, f"{url}{path}", params=params, timeout=30, json=payload,
                                 headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from exc
    if response.status_code != 200:
        fail(Console(), response)
    body: dict[str, Any] = response.json()
    return body


def print_changes(console: Console, result: dict[str, Any]) -> None:
    marks = {"create": "[green]+[/]", "update": "[yellow]~[/]", "delete": "[red]-[/]"}
    for change in result["changes"]:
        console.print(f"{marks[change['action']]} {change['kind']} {change['name']}")
        for field, (before, after) in change.get("changes", {}).items():
            console.print(f"    {field}: {before!r} -> {after!r}", highlight=False)
    verb = "would change" if result["dry_run"] else "changed"
    if result["changed"]:
        console.print(f"{len(result['changes'])} object(s) {verb}; revision {result['revision']}")
    else:
        console.print(f"no changes; revision {result['revision']}")


def apply_document(
    url: str,
    token: str,
    content: bytes,
    media: str,
    *,
    dry_run: bool,
    cascade: bool = False,
    prune: bool = True,
) -> httpx.Response:
    """POST /v1/apply: a fleet document, YAML or JSON (`media`)."""
    flags = {"dry_run": dry_run, "cascade": cascade, "prune": prune}
    return httpx.post(
        f"{url.rstrip('/')}/v1/apply",
        params={name: str(value).lower() for name, value in flags.items()},
        content=content,
        headers={"Authorization": f"Bearer {token}", "Content-Type": media},
        timeout=60,
    )


def apply_file(
    url: str, token: str, path: Path, *, dry_run: bool, cascade: bool = False, prune: bool = True
) -> httpx.Response:
    media = "application/json" if path.suffix == ".json" else "application/yaml"
    return apply_document(
        url, token, path.read_bytes(), media, dry_run=dry_run, cascade=cascade, prune=prune
    )


@click.command("apply")
@click.option(
    "-f",
    "--file",
    "path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="fleet document, YAML or JSON",
)
@click.option("--dry-run", is_flag=True, help="show what would change, change nothing")
@click.option("--cascade", is_flag=True, help="let deletes take their dependents along")
@click.option(
    "--no-prune", is_flag=True, help="create and update only: delete nothing the file leaves out"
)
@click.option("--url", default=None, help="control plane URL [$MERIDIAN_URL]")
@click.option("--token", default=None, help="bearer token [$MERIDIAN_TOKEN]")
def apply_command(
    path: Path, dry_run: bool, cascade: bool, no_prune: bool, url: str | None, token: str | None
) -> None:
    """Make the fleet match a document, and show the diff."""
    console = Console()
    url, secret = credentials(url, token)
    try:
        response = apply_file(url, secret, path, dry_run=dry_run, cascade=cascade,
                              prune=not no_prune)  # fmt: skip
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from exc
    if response.status_code != 200:
        fail(console, response)
    print_changes(console, response.json())
