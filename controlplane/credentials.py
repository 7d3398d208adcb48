"""The people signed in with `meridian login`: their tokens, kept per control plane in a file
only its owner can read (`$MERIDIAN_CREDENTIALS`, default `~/.config/meridian/credentials.json`),
and the ID token renewed with the refresh token when it is about to expire."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import click
import httpx
import jwt

RENEW_BEFORE_S = 30.0


def credentials_file() -> Path:
    given = os.environ.get("MERIDIAN_CREDENTIALS")
    if given:
        return Path(given)
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config / "meridian" / "credentials.json"


def load() -> dict[str, Any]:
    try:
        stored = json.loads(credentials_file().read_text())
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}


def save(stored: dict[str, Any]) -> None:
    path = credentials_file()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    part = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(stored, out, indent=2)
    part.replace(path)


def keep(url: str, tokens: dict[str, Any], config: dict[str, Any], previous: Any) -> None:
    """The provider's answer (`tokens`) kept as the sign-in to `url`; a refresh token it did
    not renew stays the `previous` one's."""
    id_token = tokens.get("id_token")
    if not isinstance(id_token, str):
        raise click.ClickException("the identity provider answered no ID token (scope openid?)")
    try:
        expires_at = jwt.decode(id_token, options={"verify_signature": False}).get("exp", 0)
    except jwt.PyJWTError as exc:
        raise click.ClickException(f"the identity provider's ID token is not a JWT: {exc}") from exc
    stored = load()
    stored[url] = {
        "id_token": id_token,
        "refresh_token": tokens.get("refresh_token") or (previous or {}).get("refresh_token"),
        "expires_at": expires_at,
        "token_endpoint": config["token_endpoint"],
        "client_id": config["client_id"],
    }
    save(stored)


def stored_token(url: str) -> str | None:
    """The signed-in person's ID token for the control plane at `url`, renewed when it is
    about to expire; None when nobody signed in there (or the sign-in can no longer be
    renewed: `meridian login` again)."""
    entry = load().get(url)
    if not isinstance(entry, dict) or not isinstance(entry.get("id_token"), str):
        return None
    if float(entry.get("expires_at", 0)) - time.time() > RENEW_BEFORE_S:
        return str(entry["id_token"])
    if not entry.get("refresh_token"):
        return None
    try:
        answer = httpx.post(entry["token_endpoint"], timeout=30, data={
            "grant_type": "refresh_token", "refresh_token": entry["refresh_token"],
            "client_id": entry["client_id"],
        })  # fmt: skip
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot renew the sign-in: {exc}") from exc
    if answer.status_code != 200:
        return None
    keep(url, answer.json(), entry, entry)
    return str(load()[url]["id_token"])
