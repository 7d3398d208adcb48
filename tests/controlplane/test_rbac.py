"""Who may do what: viewers read, operators also change the fleet, admins also manage access;
a tenant admin manages its own tenant's API keys, reads its tenant, the adapters it may use
and its usage, and sees nothing of any other tenant."""

from __future__ import annotations

import time

import httpx
import pytest
from meridian_pb.fleet.v1 import fleet_pb2 as pb

from controlplane.services.agents import AgentRegistration, register
from controlplane.services.usage.store import UsageStore
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
PUBLIC = {"/healthz", "/readyz", "/v1/auth/config"}


@pytest.fixture
async def tokens(api: Api) -> dict[str, str]:
    assert (await api.client.post("/v1/apply", json=BASE)).status_code == 200
    out = {}
    for role in RANK:
        out[role] = (await api.create("principals", {"name": f"p-{role}", "role": role}))["token"]
    bound = {"name": "p-acme-admin", "role": "tenant-admin", "tenant": "acme"}
    out["tenant-admin"] = (await api.create("principals", bound))["token"]
    return out


@pytest.mark.parametrize("role", [*RANK, "tenant-admin"])
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
    if role == "tenant-admin" and (method, path) == ("POST", "/v1/api-keys"):  # its own tenant's
        assert response.status_code == 201, response.text
    elif RANK.get(role, -1) >= RANK[least]:
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
    and nothing else. A tenant admin gets past authorization only where the operation is
    scoped to a tenant (`x-meridian-tenant-scope`), and is 403 everywhere else. A new endpoint
    is covered as soon as it is in the document."""
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
                elif caller == "tenant-admin":
                    if operation.get("x-meridian-tenant-scope"):
                        assert answer.status_code not in (401, 403), where
                    else:
                        assert answer.status_code == 403, where
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


async def test_a_tenant_admin_manages_its_own_keys_and_sees_nothing_of_other_tenants(
    api: Api, tokens: dict[str, str]
) -> None:
    await api.create("tenants", {"name": "globex"})
    theirs = await api.create("api-keys", {"name": "globex-prod", "tenant": "globex"})
    ours = await api.create("api-keys", {"name": "acme-prod", "tenant": "acme"})
    me = api.as_(tokens["tenant-admin"])

    async def call(
        method: str, path: str, json: object = None, params: dict[str, str] | None = None
    ) -> httpx.Response:  # as the tenant admin; a write as of any version
        headers = {**me, "If-Match": "*"}
        return await api.client.request(method, path, json=json, params=params, headers=headers)

    listed = (await call("GET", "/v1/api-keys")).json()["items"]
    assert [k["name"] for k in listed] == ["acme-prod"]
    assert [t["name"] for t in (await call("GET", "/v1/tenants")).json()["items"]] == ["acme"]
    # another tenant's objects answer as if they were not there, whatever the method
    for method, path, body in (
        ("GET", "/v1/api-keys/globex-prod", None),
        ("PATCH", "/v1/api-keys/globex-prod", {"revoked": True}),
        ("PUT", "/v1/api-keys/globex-prod", {"revoked": True}),
        ("DELETE", "/v1/api-keys/globex-prod", None),
        ("POST", "/v1/api-keys/globex-prod/rotate", {}),
        ("GET", "/v1/tenants/globex", None),
        ("PUT", "/v1/tenants/globex/budgets", {"budgets": []}),
    ):
        answer = await call(method, path, body)
        assert answer.status_code == 404, (method, path, answer.text)
        assert answer.json()["code"] == "not_found"
    made = await call("POST", "/v1/api-keys", {"tenant": "globex"})
    assert made.status_code == 422, made.text
    assert made.json()["code"] == "unknown_reference"  # as for a tenant that does not exist
    # its own: made, rotated, revoked
    assert (await call("POST", "/v1/api-keys", {"tenant": "acme"})).status_code == 201
    rotated = await call("POST", "/v1/api-keys/acme-prod/rotate", {"overlap_s": 60})
    assert rotated.status_code == 200, rotated.text
    assert rotated.json()["prefix"] == ours["prefix"]
    revoked = await call("PATCH", "/v1/api-keys/acme-prod", {"revoked": True})
    assert revoked.status_code == 200, revoked.text
    # its tenant's spend budgets, and nothing else of the tenant
    monthly = {"name": "monthly", "period": "month", "limit": 500}
    budgets = await call("PUT", "/v1/tenants/acme/budgets", {"budgets": [monthly]})
    assert budgets.status_code == 200, budgets.text
    tenant = (await api.client.get("/v1/tenants/acme")).json()
    assert [(b["name"], b["limit"]) for b in tenant["budgets"]] == [("monthly", 500)]
    bad = await call("PUT", "/v1/tenants/acme/budgets", {"budgets": [{**monthly, "limit": -1}]})
    assert bad.status_code == 422, bad.text
    sneaky = await call("PUT", "/v1/tenants/acme/budgets",
                        {"budgets": [], "requests_per_minute": 10**9})  # fmt: skip
    assert sneaky.status_code == 422, sneaky.text
    assert (await api.client.get("/v1/tenants/acme")).json()["budgets"] == tenant["budgets"]
    # and nothing of the fleet, nor its own tenant's spec to change, nor principals
    refused: list[tuple[str, str, object]] = [
        ("GET", "/v1/regions", None),
        ("GET", "/v1/principals", None),
        ("GET", "/v1/audit-events", None),
        ("PATCH", "/v1/tenants/acme", {"requests_per_minute": 10**9}),
        ("POST", "/v1/principals", {"name": "x", "role": "admin"}),
    ]
    for method, path, sent in refused:
        answer = await call(method, path, sent)
        assert answer.status_code == 403, (method, path, answer.text)
    # its usage only, whatever tenants it names
    now = int(time.time() * 1e6)
    records = [pb.UsageRecord(id=f"j-{n}", seq=n, request_id=f"r{n}", kind="served", tenant=t,
                              model="m", answered_model="m", service_class="standard",
                              started_us=now, ended_us=now + 1, prompt_tokens=1, status=200,
                              outcome="ok") for n, t in enumerate(("acme", "globex"))]  # fmt: skip
    assert await UsageStore(api.db).store(records, "us-east", "us-east-1") == 2
    window = {"start_time": str(int(time.time()) - 3600), "group_by": "tenant"}
    for named in ("globex", "acme,globex"):
        usage = await call("GET", "/v1/usage", None, {**window, "tenants": named})
        assert usage.status_code == 200, usage.text
        seen = [r["tenant"] for b in usage.json()["data"] for r in b["results"]]
        assert seen == ["acme"]
    everyone = (await api.client.get("/v1/usage", params=window)).json()["data"]
    assert sorted(r["tenant"] for b in everyone for r in b["results"]) == ["acme", "globex"]
    assert (await api.client.get("/v1/api-keys/globex-prod")).json()["revoked"] is False
    assert theirs["prefix"] != ours["prefix"]
