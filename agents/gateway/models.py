"""`GET /v1/models` and `GET /v1/models/{model}`: the models this region serves, and the LoRA
adapters of them the caller's tenant may use (no other tenant's), as the `openai` client's
`models.list()` and `models.retrieve()` read them."""

from __future__ import annotations

import orjson
from aiohttp import web

from agents.adapter_config import AdapterConfig, named
from agents.config import ModelConfig, RegionConfig, TieredRouteConfig
from agents.gateway import auth
from agents.gateway.errors import SERVER, GatewayError, ModelNotFound
from agents.gateway.relay import new_id
from agents.gateway.service import Gateway


async def list_models(gateway: Gateway, request: web.Request) -> web.Response:
    try:
        config = gateway.config_or_refuse()
        tenant, _, _ = auth.caller(request.headers.get("Authorization"), config,
                                   gateway.operator_token)  # fmt: skip
        models = sorted(config.models.values(), key=lambda m: m.name)
        data = [_model_object(m, gateway.created) for m in models]
        data += [_tiered_object(t, config, gateway.created)
                 for _, t in sorted(config.tiered.items())]  # fmt: skip
        data += [_adapter_object(a, config, gateway.created)  # only the tenant's own
                 for _, a in sorted(config.adapters.items())
                 if tenant.name in a.tenants]  # fmt: skip
        return _json({"object": "list", "data": data}, config.region)
    except GatewayError as error:
        return error.response(gateway.headers(new_id()))


async def retrieve_model(gateway: Gateway, request: web.Request) -> web.Response:
    try:
        config = gateway.config_or_refuse()
        tenant, _, _ = auth.caller(request.headers.get("Authorization"), config,
                                   gateway.operator_token)  # fmt: skip
        name = request.match_info["model"]
        model = config.models.get(name)
        if model is not None:
            return _json(_model_object(model, gateway.created), config.region)
        tiered = config.tiered.get(name)
        if tiered is not None:
            return _json(_tiered_object(tiered, config, gateway.created), config.region)
        adapter = named(config.adapters, name)
        if adapter is None or tenant.name not in adapter.tenants:  # never revealed
            raise ModelNotFound(f"no such model in region {config.region}", param="model")
        return _json(_adapter_object(adapter, config, gateway.created), config.region)
    except GatewayError as error:
        return error.response(gateway.headers(new_id()))


def _model_object(model: ModelConfig, created: int) -> dict[str, object]:
    return {"id": model.name, "object": "model", "created": created, "owned_by": "meridian",
            "root": model.name, "max_model_len": model.context_length}  # fmt: skip


def _tiered_object(
    route: TieredRouteConfig, config: RegionConfig, created: int
) -> dict[str, object]:
    """A tiered route, as a model whose answers name the tier that gave them."""
    strongest = config.models[route.tiers[-1]]
    return {"id": route.name, "object": "model", "created": created, "owned_by": "meridian",
            "root": route.name, "max_model_len": strongest.context_length,
            "tiers": list(route.tiers)}  # fmt: skip


def _adapter_object(
    adapter: AdapterConfig, config: RegionConfig, created: int
) -> dict[str, object]:
    """A tenant's LoRA adapter, as SGLang lists one: its base model its `parent`."""
    base = config.models[adapter.base_model]
    return {"id": adapter.name, "object": "model", "created": created, "owned_by": "meridian",
            "root": adapter.name, "parent": base.name,
            "max_model_len": base.context_length}  # fmt: skip


def _json(doc: object, region: str) -> web.Response:
    return web.Response(
        body=orjson.dumps(doc),
        content_type="application/json",
        headers={"x-meridian-region": region, "Server": SERVER},
    )
