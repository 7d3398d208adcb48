"""Tenants' LoRA adapters at the gateway (issue 45): a request names one in `model` (as
`base:adapter` or alone) and goes to its base model's engines with SGLang's `lora_path`
set; another tenant's adapter is answered word for word as a model that does not exist; a
client never sets `lora_path` itself; `/v1/models` lists a tenant's own adapters only."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents.adapter_config import AdapterConfig, compile_adapters
from agents.errors import SnapshotInvalid
from agents.gateway.errors import ModelNotFound
from agents.gateway.requests import parse
from tests.kits.inproc import KEY, MODEL, OTHER_KEY, local_gateway, region_config

ADAPTER = AdapterConfig("acme-support", MODEL, "/adapters/acme-support", None, 8,
                        frozenset({"acme"}))  # fmt: skip
CONFIG = region_config("us", [], adapters={ADAPTER.name: ADAPTER})
CHAT = "/v1/chat/completions"


def _body(model: str, **more: Any) -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], **more})


@pytest.mark.parametrize("asked", ["acme-support", f"{MODEL}:acme-support"])
def test_an_adapter_its_tenant_names_runs_on_its_base_with_lora_path_set(asked: str) -> None:
    inference, model = parse(CHAT, _body(asked, lora_path="other", lora_id="x"), CONFIG, "acme")
    assert model.name == MODEL
    assert inference.adapter is ADAPTER
    sent = orjson.loads(inference.upstream_body("rid-1"))
    assert sent["lora_path"] == "acme-support"  # the adapter's, not the client's
    assert "lora_id" not in sent
    assert sent["model"] == asked
    plain, _ = parse(CHAT, _body(MODEL, lora_path="acme-support"), CONFIG, "acme")
    assert plain.adapter is None
    assert "lora_path" not in orjson.loads(plain.upstream_body("rid-2"))  # the base model


@pytest.mark.parametrize("asked", ["acme-support", f"{MODEL}:acme-support", "other:acme-support"])
def test_another_tenants_adapter_is_refused_as_a_model_that_does_not_exist(asked: str) -> None:
    tenant = "beta" if not asked.startswith("other") else "acme"
    with pytest.raises(ModelNotFound) as refused:
        parse(CHAT, _body(asked), CONFIG, tenant)
    with pytest.raises(ModelNotFound) as unknown:
        parse(CHAT, _body("nothing-here"), CONFIG, tenant)
    assert str(refused.value).replace(asked, "X") == str(unknown.value).replace("nothing-here", "X")


def test_a_snapshot_adapter_must_be_of_a_model_served_here() -> None:
    snapshot = pb.Snapshot(adapters=[pb.AdapterInfo(name="a", base_model=MODEL, rank=8,
                                                    source="/a", tenants=["acme"])])  # fmt: skip
    compiled = compile_adapters(snapshot, {MODEL: object()})
    assert compiled["a"].tenants == frozenset({"acme"})
    assert compiled["a"].digest is None
    with pytest.raises(SnapshotInvalid):
        compile_adapters(snapshot, {"other": object()})
    snapshot.adapters[0].name = MODEL
    with pytest.raises(SnapshotInvalid):
        compile_adapters(snapshot, {MODEL: object()})


async def test_the_models_list_shows_a_tenant_its_own_adapters_only() -> None:
    async with local_gateway(CONFIG) as region, httpx.AsyncClient(base_url=region.url) as http:
        for key, sees in ((KEY, True), (OTHER_KEY, False)):
            headers = {"Authorization": f"Bearer {key}"}
            listed = (await http.get("/v1/models", headers=headers)).json()["data"]
            ids = {m["id"] for m in listed}
            assert ("acme-support" in ids) is sees
            one = await http.get("/v1/models/acme-support", headers=headers)
            nothing = await http.get("/v1/models/nothing-here", headers=headers)
            if sees:
                assert one.json()["parent"] == MODEL
                continue
            assert one.status_code == nothing.status_code == 404
            assert one.json()["error"] == nothing.json()["error"]
            headers["Content-Type"] = "application/json"
            chat = await http.post(CHAT, content=_body("acme-support"), headers=headers)
            assert chat.status_code == 404
            assert chat.json()["error"]["code"] == "model_not_found"
