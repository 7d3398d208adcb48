"""Stand-ins for the two cloud key services that cannot run here (Google Cloud KMS and Azure Key
Vault), with their token services, speaking their REST APIs as documented: what Meridian's
KEKs (controlplane/services/sealing/clouds.py) reach through google-auth and azure-identity,
unchanged. Each holds real keys (AES-256-GCM with the additional data; RSA-OAEP-256) and
refuses a call without the token it issued.

The fixture sets the environment the libraries read: a service account's key file whose
token URI is here (google-auth signs its JWT grant, checked here against the account's public
key), and an App Service managed identity endpoint (azure-identity)."""

from __future__ import annotations

import base64
import json
import os
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jwt
import pytest
import pytest_asyncio
from aiohttp import web
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tests.kits.http import served

GCP_TOKEN, AZURE_TOKEN, IDENTITY_HEADER = "gcp-access-token", "azure-access-token", "id-header"
OAEP = padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class CloudKms:
    def __init__(self, account_key: rsa.RSAPrivateKey) -> None:
        self.account_key = account_key
        self.gcp_keys: dict[str, AESGCM] = {}
        self.vault_keys: dict[str, rsa.RSAPrivateKey] = {}
        self.calls: list[str] = []
        self.url = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/token", self.gcp_token)
        app.router.add_post("/v1/{name:.+}:encrypt", self.gcp_encrypt)
        app.router.add_post("/v1/{name:.+}:decrypt", self.gcp_decrypt)
        app.router.add_get("/msi/token", self.azure_token)
        app.router.add_post("/keys/{name}/{version}/wrapkey", self.azure_wrap)
        app.router.add_post("/keys/{name}/{version}/unwrapkey", self.azure_unwrap)
        return app

    async def gcp_token(self, request: web.Request) -> web.Response:
        form = await request.post()
        public = self.account_key.public_key()
        # google-auth's grant names Google's token endpoint as its audience, wherever it is sent
        claims = jwt.decode(str(form["assertion"]), public, algorithms=["RS256"],
                            audience="https://oauth2.googleapis.com/token")  # fmt: skip
        assert form["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"
        assert "cloudkms" in claims["scope"]
        return web.json_response({"access_token": GCP_TOKEN, "expires_in": 3600,
                                  "token_type": "Bearer"})  # fmt: skip

    def _gcp(self, request: web.Request) -> AESGCM | None:
        if request.headers.get("Authorization") != f"Bearer {GCP_TOKEN}":
            return None
        return self.gcp_keys.setdefault(request.match_info["name"],
                                        AESGCM(AESGCM.generate_key(256)))  # fmt: skip

    async def gcp_encrypt(self, request: web.Request) -> web.Response:
        key, body = self._gcp(request), await request.json()
        if key is None:
            return _gcp_error(401, "UNAUTHENTICATED")
        self.calls.append("gcp encrypt")
        nonce, aad = os.urandom(12), base64.b64decode(body.get("additionalAuthenticatedData", ""))
        sealed = nonce + key.encrypt(nonce, base64.b64decode(body["plaintext"]), aad)
        return web.json_response({"name": request.match_info["name"],
                                  "ciphertext": base64.b64encode(sealed).decode()})  # fmt: skip

    async def gcp_decrypt(self, request: web.Request) -> web.Response:
        key, body = self._gcp(request), await request.json()
        if key is None:
            return _gcp_error(401, "UNAUTHENTICATED")
        self.calls.append("gcp decrypt")
        sealed = base64.b64decode(body["ciphertext"])
        aad = base64.b64decode(body.get("additionalAuthenticatedData", ""))
        try:
            plain = key.decrypt(sealed[:12], sealed[12:], aad)
        except InvalidTag:
            return _gcp_error(400, "INVALID_ARGUMENT")
        return web.json_response({"plaintext": base64.b64encode(plain).decode()})

    async def azure_token(self, request: web.Request) -> web.Response:
        if request.headers.get("X-IDENTITY-HEADER") != IDENTITY_HEADER:
            return web.json_response({"error": "no identity header"}, status=400)
        return web.json_response({"access_token": AZURE_TOKEN, "token_type": "Bearer",
                                  "expires_on": str(int(time.time()) + 3600),
                                  "resource": request.query.get("resource", "")})  # fmt: skip

    def _vault(self, request: web.Request) -> rsa.RSAPrivateKey | None:
        if request.headers.get("Authorization") != f"Bearer {AZURE_TOKEN}":
            return None
        name = f"{request.match_info['name']}/{request.match_info['version']}"
        return self.vault_keys.setdefault(name, rsa.generate_private_key(65537, 2048))

    async def azure_wrap(self, request: web.Request) -> web.Response:
        key, body = self._vault(request), await request.json()
        if key is None or body.get("alg") != "RSA-OAEP-256":
            return web.json_response({"error": {"code": "Unauthorized"}}, status=401)
        self.calls.append("azure wrapkey")
        wrapped = key.public_key().encrypt(_unb64url(body["value"]), OAEP)
        return web.json_response({"kid": str(request.url), "value": _b64url(wrapped)})

    async def azure_unwrap(self, request: web.Request) -> web.Response:
        key, body = self._vault(request), await request.json()
        if key is None:
            return web.json_response({"error": {"code": "Unauthorized"}}, status=401)
        self.calls.append("azure unwrapkey")
        try:
            plain = key.decrypt(_unb64url(body["value"]), OAEP)
        except ValueError:
            return web.json_response({"error": {"code": "BadParameter"}}, status=400)
        return web.json_response({"kid": str(request.url), "value": _b64url(plain)})


def _gcp_error(status: int, code: str) -> web.Response:
    error = {"error": {"code": status, "message": code.lower(), "status": code}}
    return web.json_response(error, status=status)


@pytest_asyncio.fixture
async def cloud_kms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[CloudKms]:
    fake = CloudKms(rsa.generate_private_key(65537, 2048))
    async with served(fake.app()) as url:
        fake.url = url
        _environment(fake, tmp_path, monkeypatch)
        yield fake


def _environment(fake: CloudKms, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What google-auth and azure-identity read: a service account's key file whose token URI
    is the stand-in, and an App Service managed identity endpoint there."""
    pem = fake.account_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    key_file = tmp_path / "service-account.json"
    key_file.write_text(json.dumps({
        "type": "service_account", "project_id": "meridian-test", "private_key_id": "k1",
        "private_key": pem, "client_email": "meridian@meridian-test.iam.gserviceaccount.com",
        "client_id": "1", "token_uri": f"{fake.url}/token",
    }))  # fmt: skip
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
    monkeypatch.setenv("MERIDIAN_GCP_KMS_ENDPOINT", fake.url)
    monkeypatch.setenv("IDENTITY_ENDPOINT", f"{fake.url}/msi/token")
    monkeypatch.setenv("IDENTITY_HEADER", IDENTITY_HEADER)
    monkeypatch.setenv("AZURE_TOKEN_CREDENTIALS", "ManagedIdentityCredential")


def new_name() -> str:
    return secrets.token_hex(3)


__all__: list[Any] = ["CloudKms", "cloud_kms", "new_name"]
