"""`meridian keys`: signing keys (list, rotate, by HTTP) and the key-encryption key (rotate,
rewrap: where the control plane runs, with its settings, since they need its KMS)."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from controlplane.cli import _run, load_settings
from controlplane.client import call, connect
from controlplane.db.engine import Database
from controlplane.db.provision import checked_schema, database_url
from controlplane.services.sealing.keyring import Keyring
from controlplane.services.sealing.sealer import sealer_for
from controlplane.settings import Settings

_URL = click.option("--url", default=None, help="control plane URL [$MERIDIAN_URL]")
_TOKEN = click.option("--token", default=None, help="bearer token [$MERIDIAN_TOKEN]")


@click.group("keys")
def keys() -> None:
    """Signing keys and the key-encryption key: list, rotate, rewrap."""


@keys.command("list")
@click.option("--signing", is_flag=True, help="the signing keys instead of the API keys")
@_URL
@_TOKEN
@click.pass_context
def list_command(ctx: click.Context, signing: bool, url: str | None, token: str | None) -> None:
    """The API keys (a tenant admin: its tenant's): name, tenant, prefix, expiry, and when the
    secret before a rotation stops; --signing: every signing key, its state and its KEK."""
    connect(ctx, url, token)
    if signing:
        show(Console(), call(ctx, "GET", "/v1/signing-keys")["items"])
        return
    table = Table("name", "tenant", "prefix", "expires", "revoked", "old secret until")
    cursor: str | None = None
    while True:
        page = call(ctx, "GET", "/v1/api-keys", limit=500, **({"cursor": cursor} if cursor else {}))
        for k in page["items"]:
            revoked, until = "yes" if k["revoked"] else "", k.get("previous_expires_at") or ""
            table.add_row(
                k["name"], k["tenant"], k["prefix"], k["expires_at"] or "", revoked, until
            )
        cursor = page.get("next")
        if not cursor:
            break
    Console().print(table)


@keys.group("rotate")
def rotate() -> None:
    """Rotate a key, without a failed request."""


@rotate.command("signing-key")
@click.option("--region", default=None, help="the region whose key is rotated")
@click.option("--control-plane", is_flag=True, help="the control plane's key (batch lines)")
@click.option("--immediate", is_flag=True, help="a compromised key: refused everywhere at once")
@_URL
@_TOKEN
@click.pass_context
def rotate_signing_key(
    ctx: click.Context,
    region: str | None,
    control_plane: bool,
    immediate: bool,
    url: str | None,
    token: str | None,
) -> None:
    """A new key, published to every region before it signs; the old one accepted until what
    it signed has expired (`meridian keys list` follows it)."""
    connect(ctx, url, token)
    body = {"region": region, "control_plane": control_plane, "immediate": immediate}
    done = call(ctx, "POST", "/v1/signing-keys/rotate", body)
    click.echo(f"{done['owner']}: key {done['kid']} {done['state']} at revision {done['revision']}")


class Duration(click.ParamType[int]):
    """Seconds, or a number with s, m, h or d: `90`, `15m`, `1h`, `7d`."""

    name = "duration"
    UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower()
        unit = self.UNITS.get(text[-1:], 0)
        number = text[:-1] if unit else text
        if not number.isdigit():
            self.fail(f"{value!r} is not a duration such as 90, 15m, 1h or 7d", param, ctx)
        return int(number) * (unit or 1)


def _secret_rotation(plural: str, label: str, shown: str) -> click.Command:
    @click.argument("name")
    @click.option("--overlap", type=Duration(), default="1h", show_default=True,
                  help="how long the old secret keeps working (0: it stops at once)")  # fmt: skip
    @_URL
    @_TOKEN
    @click.pass_context
    def run(
        ctx: click.Context, name: str, overlap: int, url: str | None, token: str | None
    ) -> None:
        connect(ctx, url, token)
        done = call(ctx, "POST", f"/v1/{plural}/{name}/rotate", {"overlap_s": overlap})
        until = done.get("previous_expires_at") or "now (no overlap)"
        click.echo(f"{label} {name}: the new {shown}, shown this once:")
        click.echo(done[shown])
        click.echo(f"the one before it works until {until}")

    run.__doc__ = (f"A new {shown} for the {label} (its name stays); the old one works for "
                   "--overlap more, in every region, then stops.")  # fmt: skip
    return click.command(label.replace(" ", "-"))(run)


rotate.add_command(_secret_rotation("api-keys", "api key", "key"))
rotate.add_command(_secret_rotation("principals", "principal", "token"))


@rotate.command("kek")
def rotate_kek() -> None:
    """A new key-encryption key in the key file (MERIDIAN_KMS=local), then every stored
    secret rewrapped under it. With AWS KMS: rotate the key there, or point MERIDIAN_KMS at a
    new one and run `meridian keys rewrap`."""
    settings = load_settings()
    sealer = sealer_for(settings)
    try:
        kek = sealer.keks.rotate_local()
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"new key-encryption key {kek}")
    _run(_rewrap(settings))


@keys.command("rewrap")
def rewrap() -> None:
    """Every stored secret's data key wrapped again under the current KEK (MERIDIAN_KMS); the
    secrets themselves do not change. Safe to stop and run again."""
    _run(_rewrap(load_settings()))


async def _rewrap(settings: Settings) -> None:
    sealer = sealer_for(settings)
    async with database_url(settings) as url:
        db = Database.connect(url, pool_size=1)
        try:
            await checked_schema(db, url, embedded=settings.database_url is None)
            columns = (TextColumn("rewrapping"), BarColumn(), MofNCompleteColumn())
            with Progress(*columns) as progress:
                task = progress.add_task("rewrap", total=None)
                moved = await Keyring(db, sealer).rewrap(
                    lambda done, total: progress.update(task, completed=done, total=total)
                )
            click.echo(f"{moved} secret(s) rewrapped under {sealer.keks.current.id}")
        finally:
            await db.close()


def show(console: Console, items: list[dict[str, Any]]) -> None:
    table = Table("owner", "kid", "state", "sealed under", "signs from", "retire after")
    for k in items:
        table.add_row(k["owner"], k["kid"], k["state"], k["kek"], str(k["signs_from"] or ""),
                      str(k["retire_after"] or ""))  # fmt: skip
    console.print(table)
