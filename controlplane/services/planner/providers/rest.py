"""What the GCP and Azure providers share: their REST calls over one httpx client, with a
bearer token from the environment or from the machine's metadata service, and a cloud's
refusal as ProviderError with what it said."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from controlplane.services.planner.providers.base import ProviderError

TIMEOUT_S = 30.0
Token = Callable[[httpx.AsyncClient], Awaitable[str]]


def metadata_token(env: str, url: str, headers: dict[str, str]) -> Token:
    """A token: `env`'s value where it is set; else the metadata service's (the machine's
    own identity: a GCE service account, an Azure managed identity), kept until near its
    expiry."""
    kept: dict[str, Any] = {}

    async def token(http: httpx.AsyncClient) -> str:
        given = os.environ.get(env)
        if given:
            return given
        if kept and kept["until"] > time.monotonic():
            return str(kept["token"])
        try:
            answer = await http.get(url, headers=headers, timeout=5.0)
        except httpx.HTTPError as error:
            raise ProviderError(f"no {env} and no metadata service here: {error}") from error
        if answer.status_code != 200:
            raise ProviderError(f"the metadata service answered {answer.status_code}")
        doc = answer.json()
        kept["token"] = doc["access_token"]
        kept["until"] = time.monotonic() + max(0.0, float(doc.get("expires_in", 300)) - 60)
        return str(doc["access_token"])

    return token


class Rest:
    def __init__(self, cloud: str, token: Token, http: httpx.AsyncClient | None = None) -> None:
        self.cloud = cloud
        self.token = token
        self._http = http  # made at the first call: a fleet without this cloud makes none

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=TIMEOUT_S)
        return self._http

    async def call(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {await self.token(self.http)}"}
        try:
            answer = await self.http.request(method, url, headers=headers, **kwargs)
        except httpx.HTTPError as error:
            raise ProviderError(f"{self.cloud}: cannot reach {url}: {error}") from error
        if answer.status_code >= 300:
            raise ProviderError(f"{self.cloud}: {answer.status_code}: {_said(answer)}")
        body: dict[str, Any] = answer.json() if answer.content else {}
        return body


def _said(answer: httpx.Response) -> str:
    """Both clouds say what went wrong as {"error": {"message": ...}}."""
    try:
        error = answer.json().get("error") or {}
    except ValueError:
        return answer.text[:200]
    return str(error.get("message") or answer.text[:200])
