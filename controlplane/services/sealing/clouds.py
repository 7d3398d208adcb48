"""Key-encryption keys in Google Cloud KMS and Azure Key Vault (kms.py has the key file's and
AWS KMS's), behind the same three calls.

- `gcp-kms:projects/<p>/locations/<l>/keyRings/<r>/cryptoKeys/<k>`: a symmetric key of Cloud
  KMS, called through its REST API (`encrypt`, `decrypt`) with the secret's context as
  additional authenticated data. Credentials are Google's application default ones
  (google-auth: a service account's key file in GOOGLE_APPLICATION_CREDENTIALS, workload
  identity, or the metadata server). `MERIDIAN_GCP_KMS_ENDPOINT` points it at another
  endpoint (Private Service Connect; the tests' stand-in).
- `azure-kv:https://<vault>.vault.azure.net/keys/<name>/<version>`: an RSA key of Key Vault
  (or a managed HSM), which wraps the data key with RSA-OAEP-256 (`wrapkey`, `unwrapkey`).
  Key Vault takes no associated data, so what is wrapped is the context's digest (16 bytes)
  and the data key: an unwrap checks the digest, and a key sealed for one secret does not
  open as another. Credentials are Azure's default ones (azure-identity: a managed identity,
  workload identity, or a service principal in the environment).

The calls are blocking libraries' (google-auth's session, azure-identity's credential), run in
a thread as boto3's are; a data key is unwrapped once per secret and process (sealer.py).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import re
from collections.abc import Callable
from typing import Any

import httpx

from controlplane.services.sealing.kms import SealError

GCP, AZURE = "gcp-kms", "azure-kv"
GCP_KEY = re.compile(r"^projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+$")
AZURE_KEY = re.compile(r"^https?://[^/]+/keys/[^/]+/[^/]+$")
GCP_SCOPE = "https://www.googleapis.com/auth/cloudkms"
AZURE_SCOPE = "https://vault.azure.net/.default"
AZURE_API = "7.4"


def problem(kind: str, which: str) -> str | None:
    """Why `which` names no key of `kind`; None when it does."""
    if kind == GCP and not GCP_KEY.match(which):
        return "gcp-kms: must name the key: projects/P/locations/L/keyRings/R/cryptoKeys/K"
    if kind == AZURE and not AZURE_KEY.match(which):
        return "azure-kv: must name the key's URL: https://VAULT/keys/NAME/VERSION"
    return None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _answered(answer: Any, what: str) -> dict[str, Any]:
    """The service's JSON answer (a requests' or httpx's response); SealError unless 200."""
    if answer.status_code != 200:
        raise SealError(f"{what}: {answer.status_code} {answer.text[:300]}")
    document: dict[str, Any] = answer.json()
    return document


async def _call(what: str, call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return await asyncio.to_thread(call)
    except SealError:
        raise
    except Exception as error:  # the libraries' own (auth, transport, the service's answer)
        raise SealError(f"{what} failed: {error}") from None


class GcpKek:
    def __init__(self, name: str) -> None:
        self.id, self._name = f"{GCP}:{name}", name
        self._endpoint = os.environ.get(
            "MERIDIAN_GCP_KMS_ENDPOINT", "https://cloudkms.googleapis.com"
        ).rstrip("/")
        self._session: Any = None

    async def wrap(self, data_key: bytes, context: str) -> bytes:
        body = {"plaintext": _b64(data_key), "additionalAuthenticatedData": _b64(context.encode())}
        return base64.b64decode((await self._post("encrypt", body))["ciphertext"])

    async def unwrap(self, wrapped: bytes, context: str) -> bytes:
        body = {"ciphertext": _b64(wrapped), "additionalAuthenticatedData": _b64(context.encode())}
        return base64.b64decode((await self._post("decrypt", body))["plaintext"])

    async def _post(self, method: str, body: dict[str, str]) -> dict[str, Any]:
        def call() -> dict[str, Any]:
            if self._session is None:
                import google.auth
                from google.auth.transport.requests import AuthorizedSession

                credentials, _ = google.auth.default(scopes=[GCP_SCOPE])
                self._session = AuthorizedSession(credentials)  # type: ignore[no-untyped-call]
            answer = self._session.post(f"{self._endpoint}/v1/{self._name}:{method}", json=body,
                                        timeout=30)  # fmt: skip
            return _answered(answer, what)

        what = f"Cloud KMS {method} with {self._name}"
        return await _call(what, call)


class AzureKek:
    def __init__(self, url: str) -> None:
        self.id, self._url = f"{AZURE}:{url}", url
        self._credential: Any = None

    async def wrap(self, data_key: bytes, context: str) -> bytes:
        answer = await self._post("wrapkey", _digest(context) + data_key)
        return _unb64url(answer["value"])

    async def unwrap(self, wrapped: bytes, context: str) -> bytes:
        plain = _unb64url((await self._post("unwrapkey", wrapped))["value"])
        if plain[:16] != _digest(context):
            raise SealError(f"{self.id} did not wrap this secret's key ({context})")
        return plain[16:]

    async def _post(self, method: str, value: bytes) -> dict[str, Any]:
        def call() -> dict[str, Any]:
            if self._credential is None:
                from azure.identity import DefaultAzureCredential

                self._credential = DefaultAzureCredential()
            token = self._credential.get_token(AZURE_SCOPE).token
            answer = httpx.post(
                f"{self._url}/{method}", params={"api-version": AZURE_API}, timeout=30,
                json={"alg": "RSA-OAEP-256", "value": _b64url(value)},
                headers={"Authorization": f"Bearer {token}"},
            )  # fmt: skip
            return _answered(answer, what)

        what = f"Key Vault {method} with {self._url}"
        return await _call(what, call)


def _digest(context: str) -> bytes:
    return hashlib.sha256(context.encode()).digest()[:16]
