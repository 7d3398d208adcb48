"""LoRA adapters in the admin API (issue 45): what it takes, what it refuses (each refusal
changes nothing), names clients could not tell apart, the audit of a new version, and what
deleting a tenant or a model does to the adapters that name it."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import pytest
from meridian_pb.fleet.v1.adapters import digest_of, split_model

from agents.config import compile_config
from agents.engines import tiny_model
from controlplane.push.wire import to_wire
from controlplane.services.rollouts.compose import Intent, compose, intent_doc
from controlplane.snapshot import compile_region
from tests.kits.controlplane import Api
from tests.kits.fleet_docs import BASE, example, state_from

DIGEST = "sha256:" + "0f" * 32
ADAPTER = {"name": "acme-support", "base_model": "llama-8b", "rank": 8, "tenants": ["acme"],
           "source": "s3://fine-tunes/acme/support", "digest": DIGEST}  # fmt: skip


@pytest.fixture
async def base(api: Api) -> Api:
    document = copy.deepcopy(BASE)
    document["tenants"].append({"name": "globex", "tier": "standard"})
    document["models"].append({**document["models"][0], "name": "llama-70b"})
    assert (await api.client.post("/v1/apply", json=document)).status_code == 200
    return api


async def _refused(api: Api, body: dict[str, Any], status: int, code: str) -> Any:
    before = await api.revision()
    response = await api.client.post("/v1/adapters", json=body)
    assert response.status_code == status, response.text
    problem = response.json()
    assert problem["code"] == code, problem
    assert await api.revision() == before
    listed = (await api.client.get("/v1/adapters")).json()["items"]
    assert body["name"] not in [a["name"] for a in listed]
    return problem


@pytest.mark.parametrize(
    ("change", "code", "field", "says"),
    [
        ({"base_model": "atlantis"}, "unknown_reference", "base_model", "atlantis"),
        ({"tenants": ["acme", "initech"]}, "unknown_reference", "tenants.1", "initech"),
        ({"source": "fine-tunes/acme"}, "validation_failed", "", "must be absolute"),
        ({"source": "gs://fine-tunes/acme"}, "validation_failed", "", "not an object store"),
        ({"source": "s3://fine-tunes"}, "validation_failed", "", "s3://bucket/key"),
        ({"digest": None}, "validation_failed", "", "needs its digest"),
        ({"digest": "sha256:XYZ"}, "validation_failed", "digest", "pattern"),
        ({"rank": 0}, "validation_failed", "rank", "greater than or equal"),
        ({"tenants": ["acme", "acme"]}, "validation_failed", "tenants", "must not repeat"),
        ({"name": "llama-8b:support"}, "validation_failed", "name", "pattern"),
    ],
)
async def test_a_wrong_adapter_is_refused_and_changes_nothing(
    base: Api, change: dict[str, Any], code: str, field: str, says: str
) -> None:
    problem = await _refused(base, {**ADAPTER, **change}, 422, code)
    assert says in str(problem), problem
    if field:
        assert any(e["field"].endswith(field) for e in problem["errors"]), problem


async def test_an_adapter_is_written_read_and_versioned_with_its_digest(base: Api) -> None:
    made = await base.create("adapters", ADAPTER)
    assert {k: made[k] for k in ADAPTER} == ADAPTER
    # a path on the nodes may go without a digest (the operator's own files)
    local = {**ADAPTER, "name": "globex-legal", "tenants": ["globex"], "digest": None,
             "source": "/var/lib/meridian/adapters/globex-legal"}  # fmt: skip
    assert (await base.create("adapters", local))["digest"] is None
    newer = "sha256:" + "1e" * 32
    revision = await base.revision()
    patched = await base.client.patch("/v1/adapters/acme-support", json={"digest": newer},
                                      headers={"If-Match": '"1"'})  # fmt: skip
    assert patched.status_code == 200, patched.text
    assert patched.json()["version"] == 2
    assert await base.revision() == revision + 1  # a new version: a change of intent
    events = await base.client.get("/v1/audit-events", params={"kind": "adapter"})
    audit = events.json()["items"]
    update = next(e for e in audit if e["action"] == "update")
    assert (update["before"]["digest"], update["after"]["digest"]) == (DIGEST, newer)


async def test_an_adapter_a_model_and_a_tiered_route_never_share_a_name(base: Api) -> None:
    await base.create("adapters", ADAPTER)
    await _refused(base, {**ADAPTER, "name": "llama-8b"}, 409, "name_taken")
    model = {"name": "acme-support", "source": "x/y", "context_length": 4096}
    response = await base.client.post("/v1/models", json=model)
    assert response.status_code == 409, response.text
    assert "an adapter is named" in response.json()["detail"]
    route_body = {"name": "acme-support", "tiers": ["llama-8b", "llama-70b"]}
    route = await base.client.post("/v1/tiered-routes", json=route_body)
    assert route.status_code == 409, route.text


async def test_deleting_a_tenant_takes_it_out_of_its_adapters_and_a_model_keeps_its_own(
    base: Api,
) -> None:
    await base.create("adapters", {**ADAPTER, "tenants": ["acme", "globex"]})
    first = {"If-Match": '"1"'}
    guarded = await base.client.delete("/v1/tenants/globex", headers=first)
    assert guarded.status_code == 409, guarded.text
    assert "adapter acme-support (tenant)" in guarded.text
    cascaded = await base.client.delete("/v1/tenants/globex", params={"cascade": "true"},
                                        headers=first)  # fmt: skip
    assert cascaded.is_success, cascaded.text
    adapter = (await base.client.get("/v1/adapters/acme-support")).json()
    assert adapter["tenants"] == ["acme"]
    kept = await base.client.delete("/v1/models/llama-8b", headers=first)
    assert kept.status_code == 409
    assert "adapter acme-support" in kept.text


def test_the_digest_covers_each_file_by_name_and_content_and_not_where_it_sits(
    tmp_path: Path,
) -> None:
    model = tiny_model.write(tmp_path / "tiny")
    one = tiny_model.write_adapter(tmp_path / "a" / "one", model)
    two = tiny_model.write_adapter(tmp_path / "b" / "two", model)
    (two / "adapter_config.json").write_bytes((one / "adapter_config.json").read_bytes())
    assert digest_of(one) == digest_of(two)  # the same files elsewhere
    manifest = "".join(
        f"{name}\0{hashlib.sha256((one / name).read_bytes()).hexdigest()}\n"
        for name in ("adapter_config.json", "adapter_model.safetensors")
    )
    assert digest_of(one) == "sha256:" + hashlib.sha256(manifest.encode()).hexdigest()
    other = tiny_model.write_adapter(tmp_path / "c", model, seed=2)
    assert digest_of(other) != digest_of(one)  # other weights
    (two / "adapter_model.safetensors").rename(two / "weights.safetensors")
    assert digest_of(two) != digest_of(one)  # a file renamed
    assert split_model("llama-8b:acme-support") == ("llama-8b", "acme-support")
    assert split_model("acme-support") == ("acme-support", None)
    assert split_model("llama-8b:") == ("llama-8b:", None)


def test_each_region_gets_the_adapters_of_its_models_for_the_tenants_it_may_serve() -> None:
    """A tenant bound to the eu (eurobank) has its adapters in eu-west only: never in a us
    region, even one that serves their base model."""
    document = example()
    small, strong = document["models"][0]["name"], document["models"][1]["name"]
    document["adapters"] = [
        {"name": "acme-support", "base_model": small, "rank": 8, "source": "/a/acme",
         "tenants": ["acme"]},
        {"name": "eurobank-legal", "base_model": small, "rank": 8, "source": "s3://b/legal",
         "digest": DIGEST, "tenants": ["eurobank"]},
        {"name": "shared", "base_model": small, "rank": 4, "source": "/a/shared",
         "tenants": ["acme", "eurobank"]},
        {"name": "acme-strong", "base_model": strong, "rank": 16, "source": "/a/strong",
         "tenants": ["acme"]},
    ]  # fmt: skip
    state = state_from(document)

    def held(region: str) -> dict[str, tuple[str, ...]]:
        config = compile_config(to_wire(compile_region(state, region)))
        return {name: tuple(sorted(a.tenants)) for name, a in config.adapters.items()}

    assert held("us-east") == {"acme-support": ("acme",), "shared": ("acme",),
                               "acme-strong": ("acme",)}  # fmt: skip
    assert held("eu-west") == {"acme-support": ("acme",), "eurobank-legal": ("eurobank",),
                               "shared": ("acme", "eurobank")}  # fmt: skip
    eu = compile_config(to_wire(compile_region(state, "eu-west"))).adapters["eurobank-legal"]
    assert (eu.base_model, eu.digest, eu.source) == (small, DIGEST, "s3://b/legal")
    # an older intent still rolling out grants no tenant the newest has taken out
    newest = state.model_copy(update={"adapters": {
        **state.adapters,
        "shared": state.adapters["shared"].model_copy(update={"tenants": ["eurobank"]}),
    }})  # fmt: skip
    old = compose(newest, Intent.parse(state.revision, intent_doc(state)))
    assert old.adapters["shared"].tenants == ["eurobank"]
    assert old.adapters["acme-support"].tenants == ["acme"]
