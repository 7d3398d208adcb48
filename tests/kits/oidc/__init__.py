"""A real OpenID Connect provider for the tests: panva's oidc-provider on Node (provider.mjs
beside this file), its npm packages installed from the lock file here into a directory of
their own outside the clone (keyed by the lock's hash, reused when present), by
`./scripts/test` or by the first test that needs it.

`python -m tests.kits.oidc` installs it; `signed_in` gets a person's tokens the way a
browser would (the authorization code flow with PKCE, through the provider's login page).
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agents.engines.sglang_env import default_home

HERE = Path(__file__).parent
CLIENT_ID = "meridian-cli"
PASSWORD = "any"  # the provider's development login page takes any password
SCOPES = "openid profile email groups offline_access"


def provider_dir() -> Path:
    lock = hashlib.sha256((HERE / "package-lock.json").read_bytes()).hexdigest()[:16]
    return default_home() / f"oidc-provider-{lock}"


def install() -> Path:
    """The provider's packages, installed once (`npm ci` from the lock) and then reused."""
    target = provider_dir()
    stamp = target / ".installed"
    if stamp.exists():
        return target
    npm = shutil.which("npm")
    assert npm, "Node.js and npm are not installed: ./scripts/test installs them"
    target.mkdir(parents=True, exist_ok=True)
    with (target.parent / f"{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two workers install it once
        if not stamp.exists():
            for name in ("package.json", "package-lock.json"):
                shutil.copy(HERE / name, target / name)
            subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                           cwd=target, check=True, stdout=sys.stderr)  # fmt: skip
            stamp.touch()
    return target


@dataclass
class Provider:
    issuer: str
    client_id: str

    async def metadata(self) -> dict[str, Any]:
        async with httpx.AsyncClient() as http:
            found = await http.get(f"{self.issuer}/.well-known/openid-configuration")
            document: dict[str, Any] = found.json()
            return document


@asynccontextmanager
async def oidc_provider(
    accounts: dict[str, list[str]],
    redirect_uris: list[str],
    *,
    id_token_ttl_s: int = 3600,
) -> AsyncIterator[Provider]:
    """The provider as a child process: `accounts` maps each login to its groups."""
    config = {
        "port": 0,
        "client_id": CLIENT_ID,
        "redirect_uris": redirect_uris,
        "accounts": {login: {"groups": groups} for login, groups in accounts.items()},
        "id_token_ttl_s": id_token_ttl_s,
    }
    proc = await asyncio.create_subprocess_exec(
        "node", "--input-type=module", "-e", (HERE / "provider.mjs").read_text(),
        cwd=install(), env={**os.environ, "OIDC_CONFIG": json.dumps(config)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith("listening "), f"the OIDC provider did not start: {line!r}"
        yield Provider(line.split()[1], CLIENT_ID)
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


def pkce() -> tuple[str, str]:
    """A PKCE verifier and its S256 challenge."""
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


async def signed_in(provider: Provider, login: str, redirect_uri: str) -> dict[str, Any]:
    """A person's tokens (id_token, refresh_token, ...) after signing in on the provider's
    login page: the authorization code flow with PKCE, as a browser follows it."""
    verifier, challenge = pkce()
    state = secrets.token_urlsafe(8)
    metadata = await provider.metadata()
    async with httpx.AsyncClient() as http:
        page = await http.get(metadata["authorization_endpoint"], params={
            "client_id": provider.client_id, "response_type": "code", "scope": SCOPES,
            "redirect_uri": redirect_uri, "state": state, "nonce": secrets.token_urlsafe(8),
            "code_challenge": challenge, "code_challenge_method": "S256",
        }, follow_redirects=True)  # fmt: skip
        form = re.search(r'<form[^>]*action="([^"]+)"', page.text)
        assert form, page.text
        answer = await http.post(
            httpx.URL(str(page.url)).join(form.group(1)),
            data={"prompt": "login", "login": login, "password": PASSWORD},
        )
        while answer.is_redirect and not answer.headers["location"].startswith(redirect_uri):
            answer = await http.get(answer.url.join(answer.headers["location"]))
        location = httpx.URL(answer.headers["location"])
        assert location.params.get("state") == state, location
        tokens = await http.post(metadata["token_endpoint"], data={
            "grant_type": "authorization_code", "code": location.params["code"],
            "redirect_uri": redirect_uri, "client_id": provider.client_id,
            "code_verifier": verifier,
        })  # fmt: skip
        assert tokens.status_code == 200, tokens.text
        result: dict[str, Any] = tokens.json()
        return result
