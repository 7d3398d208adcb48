"""`meridian join`: from Terraform's outputs to a fleet that serves.

Terraform makes the machines; this makes the control plane know them. It takes the document
terraform/modules/fleet-document renders (`terraform output -raw join`), then:

1. reads the admin token from the control plane's secret store (or takes MERIDIAN_TOKEN);
2. waits for the control plane to be ready (its replicas may still be booting);
3. applies the fleet document: the clouds and regions, with the pools' gateway URLs;
4. makes one bootstrap token per pool, scoped to its region (and to the node pool, where the
   document declares the pools: the machines the capacity planner adds then join it) and
   expiring, and puts it in the pool's secret store with that cloud's own CLI (aws, gcloud,
   az), from a file readable only by its owner: never on a command line, never in
   Terraform's state.

The pools' machines read the token whenever they have to register, so they may boot before
or after this runs. Run it again before the tokens expire, for machines the pools add later:
it makes fresh tokens, and the old ones lapse on their own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, Literal

import click
import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from controlplane.client import (
    ClientSettings,
    apply_document,
    apply_file,
    fail,
    print_changes,
)

CLI_TIMEOUT_S = 120
NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
POOL_NAME = r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Store(_Model):
    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, given: Any) -> Any:
        # Terraform gives each store every optional attribute of the type, null where unset
        if isinstance(given, dict):
            return {k: v for k, v in given.items() if v is not None}
        return given


class AwsSecretsManager(_Store):
    kind: Literal["aws-secretsmanager"]
    region: Annotated[str, Field(pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]+$")]
    secret: Annotated[str, Field(pattern=r"^arn:aws[a-z-]*:secretsmanager:[^\s]+$")]

    def read(self) -> list[str]:
        return ["aws", "secretsmanager", "get-secret-value", "--region", self.region,
                "--secret-id", self.secret,
                "--query", "SecretString", "--output", "text"]  # fmt: skip

    def write(self, path: Path) -> list[str]:
        return ["aws", "secretsmanager", "put-secret-value", "--region", self.region,
                "--secret-id", self.secret, "--secret-string", f"file://{path}",
                "--output", "json"]  # fmt: skip


class GcpSecretManager(_Store):
    kind: Literal["gcp-secret-manager"]
    secret: Annotated[str, Field(pattern=r"^projects/[^/\s]+/secrets/[^/\s]+$")]

    def read(self) -> list[str]:
        return ["gcloud", "secrets", "versions", "access", "latest", f"--secret={self.secret}"]

    def write(self, path: Path) -> list[str]:
        return ["gcloud", "secrets", "versions", "add", self.secret, f"--data-file={path}"]


class AzureKeyVault(_Store):
    kind: Literal["azure-key-vault"]
    vault: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9-]{1,22}[A-Za-z0-9]$")]
    secret: Annotated[str, Field(pattern=r"^[0-9A-Za-z-]{1,127}$")]

    def read(self) -> list[str]:
        return ["az", "keyvault", "secret", "show", "--vault-name", self.vault,
                "--name", self.secret, "--query", "value", "--output", "tsv"]  # fmt: skip

    def write(self, path: Path) -> list[str]:
        return ["az", "keyvault", "secret", "set", "--vault-name", self.vault,
                "--name", self.secret, "--file", str(path), "--output", "none"]  # fmt: skip


SecretStore = Annotated[
    AwsSecretsManager | GcpSecretManager | AzureKeyVault, Field(discriminator="kind")
]


class Pool(_Model):
    region: Annotated[str, Field(pattern=NAME)]
    # the fleet's node pool whose machines read this token: they join that pool (None: the
    # region's token; its nodes join no pool)
    pool: (
        Annotated[str, Field(pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")] | None
    ) = None
    bootstrap_token_store: SecretStore

    @property
    def label(self) -> str:
        return f"{self.region} / {self.pool}" if self.pool else self.region


class JoinDocument(_Model):
    """What fleet-document's `join` output holds."""

    api_version: Literal["meridian/v1"] = Field(alias="apiVersion")
    kind: Literal["Join"]
    api_url: Annotated[str, Field(pattern=r"^https?://[^\s/]+$")] | None = None
    admin_token_store: SecretStore | None = None
    token_lifetime_s: Annotated[int, Field(ge=3600, le=30 * 86400)] = 7 * 86400
    fleet: dict[str, Any]
    pools: Annotated[list[Pool], Field(max_length=1000)]

    @model_validator(mode="after")
    def _pools_are_fleet_regions(self) -> JoinDocument:
        regions = {r.get("name") for r in self.fleet.get("regions", []) if isinstance(r, dict)}
        declared = {(p.get("name"), p.get("region")) for p in self.fleet.get("node_pools", [])
                    if isinstance(p, dict)}  # fmt: skip
        named = [(p.region, p.pool) for p in self.pools]
        if len(set(named)) != len(named):
            raise ValueError("a region or a pool has two token stores: give each one")
        if missing := sorted({r for r, _ in named} - regions):
            raise ValueError(f"pools of regions the fleet does not declare: {', '.join(missing)}")
        if stray := sorted(f"{p} ({r})" for r, p in named if p and (p, r) not in declared):
            raise ValueError(f"token stores of node pools the fleet does not declare in their "
                             f"region: {', '.join(stray)}")  # fmt: skip
        stores = [p.bootstrap_token_store.model_dump_json() for p in self.pools]
        if len(set(stores)) != len(stores):
            raise ValueError("two pools name the same token store: each would overwrite the "
                             "other's token")  # fmt: skip
        return self


class StoreFailed(Exception):
    pass


def _cloud_cli(argv: list[str]) -> str:
    """Run a cloud's CLI; what it printed, or StoreFailed with what it said."""
    if shutil.which(argv[0]) is None:
        raise StoreFailed(f"`{argv[0]}` is not installed here (it is how {argv[0]}'s secret "
                          "store is reached)")  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise StoreFailed(f"`{' '.join(argv[:4])}` ran past {CLI_TIMEOUT_S} s") from None
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        raise StoreFailed(f"`{' '.join(argv[:4])}` exited {done.returncode}: "
                          f"{said[-1] if said else 'and said nothing'}")  # fmt: skip
    return done.stdout


def put_secret(store: SecretStore, value: str) -> None:
    """The value goes by a file only its owner reads, removed at once: a command line is
    visible to every user of the machine."""
    with tempfile.TemporaryDirectory(prefix="meridian-join-") as scratch:
        path = Path(scratch) / "secret"
        path.touch(mode=0o600)
        path.write_text(value)
        _cloud_cli(store.write(path))


def read_secret(store: SecretStore) -> str:
    value = _cloud_cli(store.read()).strip()
    if not value:
        raise StoreFailed(f"{store.kind} {store.secret} holds nothing")
    return value


def load(source: str) -> JoinDocument:
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as error:
        raise click.UsageError(f"cannot read {source}: {error.strerror}") from None
    try:
        return JoinDocument.model_validate(json.loads(text))
    except json.JSONDecodeError as error:
        raise click.UsageError(
            f"{source} is not JSON (`terraform output -raw join`): {error}"
        ) from None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the document"
        raise click.UsageError(f"{source}: {where}: {first['msg']}") from None


def wait_ready(console: Console, url: str, within_s: float) -> None:
    """The control plane answers /readyz with 200: its database is reachable and migrated."""
    deadline, last = time.monotonic() + within_s, ""
    with console.status(f"waiting for the control plane at {url}") as status:
        while True:
            try:
                answer = httpx.get(f"{url}/readyz", timeout=10)
                if answer.status_code == 200:
                    return
                last = f"/readyz answered {answer.status_code}"
            except httpx.HTTPError as error:
                last = str(error) or type(error).__name__
            left = deadline - time.monotonic()
            if left <= 0:
                raise click.ClickException(f"the control plane at {url} is not ready after "
                                           f"{within_s:.0f} s: {last}")  # fmt: skip
            status.update(f"waiting for the control plane at {url} ({last}; {left:.0f} s left)")
            time.sleep(min(2.0, left))


def make_token(http: httpx.Client, console: Console, pool: Pool, lifetime_s: int) -> dict[str, Any]:
    scope = {"region": pool.region} | ({"pool": pool.pool} if pool.pool else {})
    made = http.post("/v1/bootstrap-tokens", json={**scope, "expires_in_s": lifetime_s})
    if made.status_code != 201:
        fail(console, made)
    token: dict[str, Any] = made.json()
    return token


@click.command("join")
@click.option(
    "-f",
    "--file",
    "source",
    required=True,
    help="fleet-document's `join` output (`terraform output -raw join`); - for stdin",
)
@click.option(
    "--url", default=None, help="control plane URL [default: the document's, or $MERIDIAN_URL]"
)
@click.option(
    "--token",
    default=None,
    help="admin token [default: $MERIDIAN_TOKEN, or read from the document's store]",
)
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(0, 3600),
    default=900,
    show_default=True,
    help="seconds to wait for the control plane to be ready",
)
@click.option(
    "--apply",
    "also",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="a fleet document of your own (models, deployments, routing) to apply once the "
    "regions are there; repeatable",
)
@click.option(
    "--dry-run", is_flag=True, help="show what applying the fleet would change; make no token"
)
def join_command(source: str, url: str | None, token: str | None, wait_s: float,
                 also: tuple[Path, ...], dry_run: bool) -> None:  # fmt: skip
    """Apply Terraform's fleet and give each pool a fresh bootstrap token in its secret store."""
    console = Console(emoji=False, highlight=False)  # an ARN's ":secret:" is no emoji
    document = load(source)
    settings = ClientSettings()
    url = (url or document.api_url or settings.url).rstrip("/")
    secret = token or (settings.token.get_secret_value() if settings.token else None)
    if not secret:
        if document.admin_token_store is None:
            raise click.UsageError("give --token or set MERIDIAN_TOKEN (the document names no "
                                   "admin_token_store to read it from)")  # fmt: skip
        try:
            secret = read_secret(document.admin_token_store)
        except StoreFailed as error:
            raise click.ClickException(f"cannot read the admin token: {error}") from None
    wait_ready(console, url, wait_s)
    try:
        _join(console, document, url, secret, also, dry_run=dry_run)
    except httpx.HTTPError as error:
        raise click.ClickException(f"lost the control plane at {url}: {error}") from None


def _join(
    console: Console,
    document: JoinDocument,
    url: str,
    secret: str,
    also: tuple[Path, ...],
    *,
    dry_run: bool,
) -> None:
    headers = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        applied = apply_document(url, secret, json.dumps(document.fleet).encode(),
                                 "application/json", dry_run=dry_run)  # fmt: skip
        if applied.status_code != 200:
            fail(console, applied)
        print_changes(console, applied.json())
        if dry_run:
            if also:  # they may name regions that the dry run did not make
                console.print("--apply documents are not checked on a dry run")
            return
        for path in also:
            console.print(f"{path}:")
            answer = apply_file(url, secret, path, dry_run=False)
            if answer.status_code != 200:
                fail(console, answer)  # no token is made: fix the document and run it again
            print_changes(console, answer.json())
        table = Table("region / pool", "bootstrap token", "expires", "put in")
        failed = 0
        for pool in document.pools:
            store = pool.bootstrap_token_store
            made = make_token(http, console, pool, document.token_lifetime_s)
            try:
                put_secret(store, made["token"])
            except StoreFailed as error:
                failed += 1
                # a token nobody holds is one fewer secret to leak: take it back
                http.delete(f"/v1/bootstrap-tokens/{made['name']}", headers={"If-Match": "*"})
                table.add_row(pool.label, "[red]none[/]", "", f"[red]{escape(str(error))}[/]")
                continue
            expires = made["expires_at"][:16].replace("T", " ") + " UTC"
            table.add_row(pool.label, made["name"], expires,
                          escape(f"{store.kind} {store.secret}"))  # fmt: skip
    console.print(table)
    if failed:
        raise click.ClickException(f"{failed} of {len(document.pools)} pool(s) got no token")
