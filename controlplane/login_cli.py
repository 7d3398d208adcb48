"""`meridian login`: a person signs in through the organisation's identity provider with the
OAuth 2.0 device authorization flow (RFC 8628): the CLI shows a code and a link, the person
confirms it in any browser, and the CLI receives the tokens. They are kept per control plane
in a file only its owner can read (`$MERIDIAN_CREDENTIALS`, default
`~/.config/meridian/credentials.json`), and every `meridian` command that talks to the
control plane uses them when given no --token; the ID token is renewed with the refresh token
when it is about to expire. `meridian logout` forgets them.
"""

from __future__ import annotations

import time
from typing import Any

import click
import httpx
from rich.console import Console

from controlplane.client import ClientSettings
from controlplane.credentials import keep, load, save

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


def _provider(url: str) -> dict[str, Any]:
    try:
        answer = httpx.get(f"{url}/v1/auth/config", timeout=30)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from exc
    if answer.status_code != 200:
        raise click.ClickException(f"{url}/v1/auth/config: {answer.status_code} {answer.text}")
    config = answer.json().get("oidc")
    if not config:
        raise click.ClickException(
            f"{url} signs nobody in (no MERIDIAN_OIDC_ISSUER there): use a token (--token)"
        )
    if not config.get("device_authorization_endpoint"):
        raise click.ClickException(f"{config['issuer']} offers no device authorization flow")
    return dict(config)


def _wait_for_tokens(device: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """Poll the token endpoint as RFC 8628 3.4-3.5 says, until the person confirms, refuses
    or the code expires."""
    interval = float(device.get("interval") or 5)
    deadline = time.monotonic() + float(device.get("expires_in") or 600)
    while time.monotonic() < deadline:
        time.sleep(interval)
        answer = httpx.post(config["token_endpoint"], timeout=30, data={
            "grant_type": DEVICE_GRANT, "device_code": device["device_code"],
            "client_id": config["client_id"],
        })  # fmt: skip
        if answer.status_code == 200:
            tokens: dict[str, Any] = answer.json()
            return tokens
        error = answer.json().get("error") if answer.content else None
        if error == "authorization_pending":
            continue
        if error == "slow_down":
            interval += 5
            continue
        if error == "access_denied":
            raise click.ClickException("the sign-in was refused")
        raise click.ClickException(f"the identity provider answered {answer.status_code} {error}")
    raise click.ClickException("the code expired before it was confirmed: run meridian login again")


@click.command("login")
@click.option("--url", default=None, help="control plane URL [$MERIDIAN_URL]")
def login_command(url: str | None) -> None:
    """Sign in through the identity provider (device flow); later commands use the sign-in."""
    url = (url or ClientSettings().url).rstrip("/")
    console = Console()
    config = _provider(url)
    try:
        answer = httpx.post(
            config["device_authorization_endpoint"],
            timeout=30,
            data={"client_id": config["client_id"], "scope": config["scopes"]},
        )
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach {config['issuer']}: {exc}") from exc
    if answer.status_code != 200:
        raise click.ClickException(f"the identity provider refused: {answer.text}")
    device = answer.json()
    link = device.get("verification_uri_complete") or device["verification_uri"]
    console.print(f"Open [bold]{link}[/] and confirm the code [bold]{device['user_code']}[/]")
    with console.status("waiting for the sign-in to be confirmed"):
        tokens = _wait_for_tokens(device, config)
    keep(url, tokens, config, None)
    me = httpx.get(f"{url}/v1/auth/whoami", timeout=30,
                   headers={"Authorization": f"Bearer {tokens['id_token']}"})  # fmt: skip
    if me.status_code != 200:
        detail = me.json().get("detail", me.text) if me.content else me.status_code
        raise click.ClickException(f"signed in, but {url} refuses: {detail}")
    who = me.json()
    tenant = f" of {who['tenant']}" if who.get("tenant") else ""
    console.print(f"Signed in to {url} as {who['name']}, {who['role']}{tenant}")


@click.command("logout")
@click.option("--url", default=None, help="control plane URL [$MERIDIAN_URL]")
def logout_command(url: str | None) -> None:
    """Forget the sign-in to a control plane."""
    url = (url or ClientSettings().url).rstrip("/")
    stored = load()
    if stored.pop(url, None) is None:
        click.echo(f"nobody is signed in to {url}")
        return
    save(stored)
    click.echo(f"signed out of {url}")
