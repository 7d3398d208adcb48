"""Who may do what: viewers read, operators also change the fleet, admins also manage access."""

from __future__ import annotations

import pytest

from tests.controlplane.conftest import Api
from tests.controlplane.fleet import BASE

# (method, path, body, least role that may)
ACTIONS = [
    ("GET", "/v1/regions", None, "viewer"),
    ("GET", "/v1/audit-events", None, "viewer"),
    ("GET", "/v1/principals", None, "viewer"),
    ("GET", "/v1/status", None, "viewer"),
    ("POST", "/v1/clouds", {"name": "oci", "provider": "oci"}, "operator"),
    ("POST", "/v1/bootstrap-tokens", {"region": "us-east"}, "operator"),
    ("POST", "/v1/apply?dry_run=true", {"clouds": BASE["clouds"]}, "operator"),
    ("POST", "/v1/tenants", {"name": "initech"}, "admin"),
    ("POST", "/v1/api-keys", {"tenant": "acme"}, "admin"),
    ("POST", "/v1/principals", {"name": "eve", "role": "admin"}, "admin"),
    ("POST", "/v1/apply?dry_run=true", {"tenants": BASE["tenants"]}, "admin"),
]
RANK = {"viewer": 0, "operator": 1, "admin": 2}


@pytest.fixture
async def tokens(api: Api) -> dict[str, str]:
    assert (await api.client.post("/v1/apply", json=BASE)).status_code == 200
    out = {}
    for role in RANK:
        out[role] = (await api.create("principals", {"name": f"p-{role}", "role": role}))["token"]
    return out


@pytest.mark.parametrize("role", list(RANK))
@pytest.mark.parametrize(("method", "path", "body", "least"), ACTIONS)
async def test_role_matrix(
    api: Api,
    tokens: dict[str, str],
    role: str,
    method: str,
    path: str,
    body: dict[str, object] | None,
    least: str,
) -> None:
    response = await api.client.request(method, path, json=body, headers=api.as_(tokens[role]))
    if RANK[role] >= RANK[least]:
        assert response.status_code in (200, 201), response.text
    else:
        assert response.status_code == 403, response.text
        assert response.json()["code"] == "forbidden"


@pytest.mark.parametrize("header", [None, "Bearer nope", "Basic dXNlcjpwYXNz", "Bearer "])
async def test_missing_or_bad_token_is_401(api: Api, header: str | None) -> None:
    headers = {"Authorization": header} if header is not None else {}
    api.client.headers.pop("Authorization", None)
    response = await api.client.get("/v1/regions", headers=headers)
    assert response.status_code == 401
    assert response.json()["code"] == "unauthenticated"
    assert response.headers["www-authenticate"] == "Bearer"


async def test_a_deleted_principal_loses_access(api: Api, tokens: dict[str, str]) -> None:
    assert (await api.client.get("/v1/regions", headers=api.as_(tokens["viewer"]))).is_success
    gone = await api.client.delete("/v1/principals/p-viewer", headers={"If-Match": "*"})
    assert gone.status_code == 204
    after = await api.client.get("/v1/regions", headers=api.as_(tokens["viewer"]))
    assert after.status_code == 401
