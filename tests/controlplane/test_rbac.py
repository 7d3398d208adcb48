"""Who may do what: viewers read, operators also change the fleet, admins also manage access."""

from __future__ import annotations

import pytest

from controlplane.services.agents import AgentRegistration, register
from tests.kits.controlplane import Api
from tests.kits.fleet_docs import BASE

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
PUBLIC = {"/healthz", "/readyz"}


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


async def _callers(api: Api, tokens: dict[str, str]) -> dict[str, str | None]:
    """A bearer of every kind: the three roles, an agent's credential, a tenant's API key."""
    made = await api.create("bootstrap-tokens", {"region": "us-east"})
    agent = await register(
        api.db, made["token"], AgentRegistration(region="us-east", hostname="gpu-1")
    )
    key = (await api.create("api-keys", {"tenant": "acme"}))["key"]
    return {**tokens, "agent": agent.credential, "tenant": key, "nobody": None}


async def test_every_operation_of_the_openapi_document_declares_and_enforces_its_role(
    api: Api, tokens: dict[str, str]
) -> None:
    """Each operation declares its least role (`x-meridian-role`); every bearer below it is
    refused (403), every bearer that is not a principal is 401, every one at or above it gets
    past authorization. A tenant's operations (`tenant`: the Batch API) take a tenant's key
    and nothing else. A new endpoint is covered as soon as it is in the document."""
    callers = await _callers(api, tokens)
    spec = (await api.client.get("/openapi.json")).json()
    checked = 0
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            least = operation.get("x-meridian-role")
            if path in PUBLIC:
                assert least is None, f"{method} {path} is public"
                continue
            assert least in (*RANK, "tenant"), f"{method.upper()} {path} declares no role"
            url = path.replace("{name}", "rbac-probe")
            body: dict[str, object] | None = {} if "requestBody" in operation else None
            for caller, token in callers.items():
                answer = await api.client.request(
                    method, url, json=body, headers={"Authorization": f"Bearer {token}"}
                    if token else {"Authorization": ""},
                )  # fmt: skip
                where = f"{caller} {method.upper()} {path}: {answer.status_code} {answer.text}"
                if least == "tenant":  # a tenant's own (the Batch API): its key, no token
                    if caller == "tenant":
                        assert answer.status_code not in (401, 403), where
                    else:
                        assert answer.status_code == 401, where
                elif caller not in RANK:
                    assert answer.status_code == 401, where
                elif RANK[caller] < RANK[least]:
                    assert answer.status_code == 403, where
                    assert answer.json()["code"] == "forbidden"
                else:
                    assert answer.status_code not in (401, 403), where
            checked += 1
    assert checked >= 60


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
