"""Single sign-on against a real OpenID Connect provider (oidc-provider on Node, with real
signed ID tokens and its discovery document; tests/kits/oidc): people's groups make their
role, a tenant admin's group binds it to its tenant, a token the provider did not sign or made
for another client is refused, and service-account tokens keep working beside it, also while
the provider cannot be reached."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from controlplane.api.app import create_app
from controlplane.db.engine import Database
from controlplane.settings import Settings
from tests.kits.controlplane import ADMIN_TOKEN, Api, kek_file
from tests.kits.oidc import Provider, oidc_provider, signed_in

REDIRECT = "http://127.0.0.1:1/callback"  # never reached: the kit reads the code off the redirect
ACCOUNTS = {
    "ada": ["platform-admins", "everyone"],
    "otto": ["sre", "acme-admins", "everyone"],  # a global role wins over a tenant's
    "vera": ["everyone"],
    "tess": ["acme-admins"],
    "mona": ["marketing"],  # signed in, but no group maps to a role
    "split": ["acme-admins", "globex-admins"],
}
ROLES = {
    "platform-admins": "admin",
    "sre": "operator",
    "everyone": "viewer",
    "acme-admins": "tenant-admin:acme",
    "globex-admins": "tenant-admin:globex",
}


@asynccontextmanager
async def sso_api(
    database_url: str, tmp_path: Path, provider: Provider, audience: str | None = None
) -> AsyncIterator[Api]:
    settings = Settings(
        database_url=database_url, admin_token=ADMIN_TOKEN, data_dir=tmp_path,
        kms_key_file=Path(kek_file(database_url)), oidc_issuer=provider.issuer,
        oidc_client_id=provider.client_id, oidc_roles=ROLES, oidc_audience=audience,
    )  # fmt: skip
    db = Database.connect(database_url, pool_size=4)
    transport = httpx.ASGITransport(app=create_app(settings, db))
    async with httpx.AsyncClient(transport=transport, base_url="http://controlplane") as client:
        yield Api(client, db)
    await db.close()


@pytest.fixture
async def provider() -> AsyncIterator[Provider]:
    async with oidc_provider(ACCOUNTS, [REDIRECT]) as running:
        yield running


async def _token(provider: Provider, login: str) -> str:
    return str((await signed_in(provider, login, REDIRECT))["id_token"])


async def test_groups_make_roles_and_a_tenant_admin_sees_its_tenant_alone(
    database_url: str, tmp_path: Path, provider: Provider
) -> None:
    async with sso_api(database_url, tmp_path, provider) as api:
        admin = api.as_(ADMIN_TOKEN)
        for tenant in ("acme", "globex"):
            assert (await api.client.post("/v1/tenants", json={"name": tenant},
                                          headers=admin)).status_code == 201  # fmt: skip
            key = {"name": f"{tenant}-prod", "tenant": tenant}
            assert (await api.client.post("/v1/api-keys", json=key,
                                          headers=admin)).status_code == 201  # fmt: skip
        expected: dict[str, tuple[str, str | None]] = {
            "ada": ("admin", None),
            "otto": ("operator", None),
            "vera": ("viewer", None),
            "tess": ("tenant-admin", "acme"),
        }
        tokens = {login: await _token(provider, login) for login in ACCOUNTS}
        for login, (role, bound) in expected.items():
            me = await api.client.get("/v1/auth/whoami", headers=api.as_(tokens[login]))
            assert me.status_code == 200, me.text
            assert me.json() == {"name": f"oidc:{login}@example.test", "role": role,
                                 "tenant": bound}  # fmt: skip
        # what each may do follows from the role
        new_tenant = {"name": "initech"}
        for login, status in (("vera", 403), ("otto", 403), ("ada", 201)):
            answer = await api.client.post("/v1/tenants", json=new_tenant,
                                           headers=api.as_(tokens[login]))  # fmt: skip
            assert answer.status_code == status, (login, answer.text)
        assert (
            await api.client.get("/v1/regions", headers=api.as_(tokens["vera"]))
        ).status_code == 200
        # the tenant admin: its tenant's keys only, and nothing of the fleet
        tess = api.as_(tokens["tess"])
        keys = (await api.client.get("/v1/api-keys", headers=tess)).json()["items"]
        assert [key["name"] for key in keys] == ["acme-prod"]
        assert (await api.client.get("/v1/api-keys/globex-prod", headers=tess)).status_code == 404
        assert (await api.client.get("/v1/regions", headers=tess)).status_code == 403
        mine = await api.client.post("/v1/api-keys", json={"tenant": "acme"}, headers=tess)
        assert mine.status_code == 201, mine.text
        theirs = await api.client.post("/v1/api-keys", json={"tenant": "globex"}, headers=tess)
        assert theirs.status_code == 422, theirs.text  # as if the tenant did not exist
        assert theirs.json()["code"] == "unknown_reference"
        # signed in, but no role: told so, and nothing shown
        for login in ("mona", "split"):
            refused = await api.client.get("/v1/auth/whoami", headers=api.as_(tokens[login]))
            assert refused.status_code == 403, refused.text
            assert refused.json()["code"] == "no_role"
        # the audit log names the person
        audit = await api.client.get("/v1/audit-events", headers=admin, params={"kind": "tenant"})
        assert "oidc:ada@example.test" in {entry["principal"] for entry in audit.json()["items"]}


def _forged(token: str, **claims: object) -> str:
    """The token with its claims changed and its signature kept."""
    header, payload, signature = token.split(".")
    body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    changed = json.dumps({**body, **claims}).encode()
    return ".".join([header, base64.urlsafe_b64encode(changed).rstrip(b"=").decode(), signature])


async def test_a_token_the_provider_did_not_sign_for_this_client_is_refused(
    database_url: str, tmp_path: Path, provider: Provider
) -> None:
    token = await _token(provider, "vera")
    async with sso_api(database_url, tmp_path, provider) as api:
        assert (await api.client.get("/v1/regions", headers=api.as_(token))).status_code == 200
        for bad in (
            _forged(token, groups=["platform-admins"]),  # promoted by editing the claims
            token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB"),
            "a.b.c",
        ):
            refused = await api.client.get("/v1/regions", headers=api.as_(bad))
            assert refused.status_code == 401, refused.text
            assert refused.json()["code"] == "unauthenticated"
    # the same provider, the same person: a control plane that expects another audience
    async with sso_api(database_url, tmp_path, provider, audience="another-app") as api:
        refused = await api.client.get("/v1/regions", headers=api.as_(token))
        assert refused.status_code == 401, refused.text
        assert "audience" in refused.json()["detail"].lower()


async def test_service_accounts_work_beside_sso_and_while_the_provider_is_away(
    database_url: str, tmp_path: Path
) -> None:
    async with oidc_provider(ACCOUNTS, [REDIRECT]) as provider:
        token = await _token(provider, "vera")
        async with sso_api(database_url, tmp_path, provider) as api:
            config = (await api.client.get("/v1/auth/config")).json()["oidc"]
            assert config["issuer"] == provider.issuer
            assert config["client_id"] == provider.client_id
            assert config["device_authorization_endpoint"].startswith(provider.issuer)
            made = await api.client.post("/v1/principals", headers=api.as_(ADMIN_TOKEN),
                                         json={"name": "ci", "role": "viewer"})  # fmt: skip
            robot = made.json()["token"]
    # the provider is gone (and this control plane never fetched its keys)
    async with sso_api(database_url, tmp_path, provider) as api:
        away = await api.client.get("/v1/regions", headers=api.as_(token))
        assert away.status_code == 503, away.text
        assert away.json()["code"] == "identity_provider_unavailable"
        assert (await api.client.get("/v1/regions", headers=api.as_(robot))).status_code == 200


async def test_without_a_provider_only_tokens_are_taken(api: Api) -> None:
    assert (await api.client.get("/v1/auth/config", headers={"Authorization": ""})).json() == {
        "oidc": None
    }
    me = await api.client.get("/v1/auth/whoami")
    assert me.json() == {"name": "bootstrap-admin", "role": "admin", "tenant": None}
