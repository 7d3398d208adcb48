"""An inference request as the gateway needs it: parsed once, validated before any engine sees
it, and the body passed on as the client sent it but for what the gateway adds in front."""

from __future__ import annotations

import functools
import hashlib
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import orjson
from meridian_pb.fleet.v1.classes import HEADER, SERVICE_TIERS, ServiceClass

from agents.adapter_config import AdapterConfig, named
from agents.config import ModelConfig, RegionConfig, TieredRouteConfig
from agents.engines.tokenizers import PromptTokenizer
from agents.gateway import schema
from agents.gateway.errors import (
    BadRequest,
    CapabilityMissing,
    ContextTooLong,
    GatewayError,
    ModelNotFound,
)

EMPTY: Mapping[str, Any] = MappingProxyType({})
ENGINE_OWNED = ("priority", "lora_path", "lora_id")  # SGLang's fields a client never sets
IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})
# what a request whose whole answer may be gathered from a stream sets (agents/gateway/gather.py)
PLAIN = frozenset({
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "top_k", "min_p", "stop", "n", "stream", "service_tier", "user",
})  # fmt: skip


@dataclass
class Inference:
    path: str  # the engine's endpoint: /v1/chat/completions, /v1/completions or /generate
    body: bytes  # as the client sent it
    model: str
    stream: bool
    key: bytes  # the prompt, for the prefix index
    wants_usage: bool  # the client asked for the usage chunk of a stream
    has_stream_options: bool
    native: bool  # SGLang's /generate
    messages: list[Any] | None = None  # a chat's, for the engine's tokenizer
    text: str | None = None  # a completion's prompt, likewise
    key_is_tokens: bool = False  # the client sent token ids: the key is them
    max_new: int | None = None  # the answer's most tokens, when the request sets them
    stops: bool = False  # the request gives stop sequences (the quality guard)
    tool_forced: str | None = None  # tool_choice forces a call: "*" (required) or the name
    batch: int = 1  # prompts: a completions batch is a request per prompt in the engine
    json_wanted: bool = False  # response_format: a JSON object or schema (the quality guard)
    # the tools offered: name -> its parameters' JSON schema, or None (the quality guard)
    tools: Mapping[str, Any] = field(default_factory=lambda: EMPTY)
    needs: frozenset[str] = frozenset()  # the capabilities it asks of a model (tools, vision)
    tiered: TieredRouteConfig | None = None  # asked of a tiered route (a virtual model)
    doc: dict[str, Any] | None = None  # the body, parsed: kept for a tiered request only
    extra: bytes = b""  # fields the gateway adds to what the engine gets ('"name":value,'):
    # its class's priority
    client_salt: str = ""  # the client's own cache_salt, folded into its tenant's
    salt: str = ""  # its tenant's prefix-cache namespace (`cache_salt`), set on arrival
    asked_class: ServiceClass | None = None  # its service_tier's class (None: its default)
    plain: bool = False  # a whole answer that may be gathered from a stream (`plain`)
    gathered: bool = False  # it is: its class gives way (agents/gateway/gather.py)
    adapter: AdapterConfig | None = None  # the tenant's LoRA adapter `model` names

    def tokens(self, tokenizer: PromptTokenizer) -> bytes:
        """The prompt as the engine's token ids, four bytes a token (as `key` for ids)."""
        if self.key_is_tokens:
            return self.key
        if self.messages is not None:
            return _ids(tokenizer.chat(self.messages))
        return _ids(tokenizer.text(self.text or ""))

    def upstream_body(self, rid: str, extra: bytes = b"", body: bytes | None = None) -> bytes:
        """The client's body (or `body`, made from it) with `rid` (and `extra` fields) put in
        front; the client's own fields come later and so win where they repeat a name (as JSON
        parsers read it)."""
        head = b'{"rid":' + orjson.dumps(rid) + b"," + self.extra
        if self.salt:
            head += b'"cache_salt":"' + self.salt.encode() + b'",'
        if self.adapter is not None:
            head += b'"lora_path":' + orjson.dumps(self.adapter.name) + b","
        if self.stream and not self.native and not self.has_stream_options:
            head += b'"stream_options":{"include_usage":true},'
        return head + extra + (self.body if body is None else body).lstrip()[1:]


def parse(
    path: str, raw: bytes, config: RegionConfig, tenant: str
) -> tuple[Inference, ModelConfig]:
    """What `tenant`'s request asks, checked whole against its model."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise BadRequest(f"the body is not JSON: {error}") from None
    if not isinstance(body, dict) or not body:
        raise BadRequest("the body must be a JSON object")
    client_salt = body.pop("cache_salt", None)  # the engine gets its tenant's, this folded in
    bad_salt = not isinstance(client_salt, str) or len(client_salt) > MAX_SALT
    if client_salt is not None and bad_salt:
        raise BadRequest(f"cache_salt must be a string of at most {MAX_SALT} characters",
                         param="cache_salt")  # fmt: skip
    # SGLang's own `priority` is its class's (Inference.extra) and its `lora_path` the
    # adapter `model` names, never what a client says
    popped = [body.pop(field, EMPTY) is not EMPTY for field in ENGINE_OWNED]
    if client_salt is not None or any(popped):
        raw = orjson.dumps(body)
    native = path == "/generate"
    name = body.get("model")
    tiered = config.tiered.get(name) if isinstance(name, str) and not native else None
    adapter = None
    if isinstance(name, str) and config.adapters:
        adapter = named(config.adapters, name)
        if adapter is not None and tenant not in adapter.tenants:
            # as a model that does not exist: another tenant's adapter is never revealed
            raise unknown_model(name, config.region)
    # a tiered request is checked against what its tiers take together; its tier (one that
    # takes what it needs) is chosen next; a tenant's adapter, against its base model
    model = (
        _tiers_model(tiered, config) if tiered is not None
        else config.models[adapter.base_model] if adapter is not None
        else _model(body, config, native)
    )  # fmt: skip
    try:
        inference = _parsed(path, raw, body, model, native)
    except GatewayError as error:
        error.model = model.name  # a refusal of the model's: counted as its
        raise
    if tiered is not None:
        inference.tiered, inference.doc = tiered, body
    inference.adapter = adapter
    inference.client_salt = client_salt or ""
    tier = body.get("service_tier")
    if tier is not None:
        inference.asked_class = _tier_class(tier)
    return inference, model


def _tier_class(tier: Any) -> ServiceClass | None:
    if not isinstance(tier, str) or tier not in SERVICE_TIERS:
        raise BadRequest(
            f"service_tier must be one of {', '.join(SERVICE_TIERS)}", param="service_tier"
        )
    return SERVICE_TIERS[tier]


def asked_class(header: str | None, inference: Inference) -> ServiceClass | None:
    """The class a request names: by the header or its service_tier (the lower, if both);
    None: its tenant's default."""
    tier = inference.asked_class
    if header is None:
        return tier
    try:
        named = ServiceClass.named(header.strip())
    except ValueError as error:
        raise BadRequest(str(error), param=HEADER) from None
    return named if tier is None else max(named, tier)


MAX_SALT = 256


@functools.lru_cache(maxsize=4096)
def cache_salt(tenant: str, client: str = "") -> str:
    """The `cache_salt` of a tenant's requests: SGLang keeps a prefix in its cache per
    salt, so no tenant's cached prefix is another's, and a cached-token count or a fast first
    token never tells one tenant what another sent. A client's own salt is folded into its
    tenant's, never used alone: no tenant can name another's namespace."""
    return hashlib.blake2b(f"{tenant}\0{client}".encode(), digest_size=12).hexdigest()


def _parsed(
    path: str, raw: bytes, body: dict[str, Any], model: ModelConfig, native: bool
) -> Inference:
    params = schema.checked(path, body)
    messages = None
    batch = 1
    needs: frozenset[str] = frozenset()
    if isinstance(params, schema.ChatParams):
        key, needs = _chat_key(body, model, params)
        messages = body["messages"]
        max_new = _first(params.max_completion_tokens, params.max_tokens)
        forced = _forced(params) if params.tools else None
    elif isinstance(params, schema.CompletionParams):
        forced = None
        key = _prompt_key(params.prompt)
        batch = _batch(params.prompt)
        max_new = params.max_tokens
    else:
        assert isinstance(params, schema.GenerateParams)
        forced = None
        key = _native_key(params)
        max_new = params.sampling_params.max_new_tokens if params.sampling_params else None
    sampling = params.sampling_params if isinstance(params, schema.GenerateParams) else params
    stops = bool(getattr(sampling, "stop", None))
    options = getattr(params, "stream_options", None)
    source = body.get("prompt") if path == "/v1/completions" else body.get("text")
    text = source if isinstance(source, str) else None
    if isinstance(source, list) and source and isinstance(source[0], str):
        text = source[0]
    inference = Inference(
        path, raw, model.name, params.stream, key, bool(options and options.include_usage),
        "stream_options" in body, native, messages=messages, text=text,
        key_is_tokens=messages is None and text is None, max_new=max_new, stops=stops,
        json_wanted=_json_wanted(body.get("response_format")), tools=_tools(body),
        needs=needs, tool_forced=forced, batch=batch, plain=plain(path, body),
    )  # fmt: skip
    return inference


def plain(path: str, body: dict[str, Any]) -> bool:
    """A whole answer that may be gathered from a stream and carried on where it gave way:
    chat, or a completion of one text prompt, asking nothing a continuation would read
    differently (tools, logprobs, response formats, seeds, penalties, SGLang's own fields)."""
    if path not in ("/v1/chat/completions", "/v1/completions") or not body.keys() <= PLAIN:
        return False
    if body.get("stream") or body.get("n", 1) not in (1, None):
        return False
    if path == "/v1/completions":
        prompt = body.get("prompt")
        return isinstance(prompt, str) or (
            isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str)
        )
    return True


def _forced(params: schema.ChatParams) -> str | None:
    """The tool call tool_choice forces: "*" for any ("required"), or the function named."""
    choice = params.tool_choice
    if choice == "required":
        return "*"
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        return name if isinstance(name, str) else None
    return None


def _tiers_model(tiered: TieredRouteConfig, config: RegionConfig) -> ModelConfig:
    tiers = [config.models[t] for t in tiered.tiers]
    capabilities = frozenset().union(*(m.capabilities for m in tiers))
    return ModelConfig(tiered.name, max(m.context_length for m in tiers), capabilities)


def _json_wanted(form: Any) -> bool:
    return isinstance(form, dict) and form.get("type") in ("json_object", "json_schema")


def _tools(body: dict[str, Any]) -> Mapping[str, Any]:
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return EMPTY
    out = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            out[function["name"]] = parameters if isinstance(parameters, dict) else None
    return out


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def check_context(model: ModelConfig, prompt_tokens: int, max_new: int | None) -> None:
    """The prompt and the longest answer asked for fit the model's context (the prompt's
    tokens are the router's estimate where the engine's tokenizer is not at hand)."""
    too_long = context_error(model, prompt_tokens, max_new)
    if too_long is not None:
        raise too_long


def context_error(
    model: ModelConfig, prompt_tokens: int, max_new: int | None
) -> ContextTooLong | None:
    """What `check_context` refuses, or None where it fits."""
    if not model.context_length:
        return None
    if prompt_tokens > model.context_length:
        return ContextTooLong(
            f"the prompt is about {prompt_tokens} tokens; "
            f"{model.name} takes {model.context_length}",
            param="messages",
        )
    if max_new is not None and prompt_tokens + max_new > model.context_length:
        return ContextTooLong(
            f"the prompt (about {prompt_tokens} tokens) and max_tokens ({max_new}) exceed "
            f"{model.name}'s context of {model.context_length}",
            param="max_tokens",
        )
    return None


def _model(body: dict[str, Any], config: RegionConfig, native: bool) -> ModelConfig:
    name = body.get("model")
    if name is None and native and len(config.models) == 1:
        return next(iter(config.models.values()))  # /generate names no model: the only one
    if not isinstance(name, str) or not name:
        raise BadRequest("model is required", param="model")
    model = config.models.get(name)
    if model is None:
        raise unknown_model(name, config.region)
    return model


def unknown_model(name: str, region: str) -> ModelNotFound:
    """What a request for a model not served here gets (and one for an adapter its tenant
    may not use, word for word)."""
    return ModelNotFound(f"the model {name!r} is not served in region {region}")


def _chat_key(
    body: dict[str, Any], model: ModelConfig, params: schema.ChatParams
) -> tuple[bytes, frozenset[str]]:
    """The prompt as the index keys it, and the capabilities it needs of a model."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    needs = set()
    if params.tools or body.get("functions"):
        if "tools" not in model.capabilities:
            raise CapabilityMissing(f"{model.name} does not take tools", param="tools")
        needs.add("tools")
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in schema.ROLES:
            raise BadRequest(
                f"each message needs a role: one of {', '.join(schema.ROLES)}", param="messages"
            )
        parts.append(message["role"])
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict):
                    raise BadRequest("content parts must be objects", param="messages")
                if part.get("type") in IMAGE_PARTS:
                    if "vision" not in model.capabilities:
                        raise CapabilityMissing(
                            f"{model.name} does not take images", param="messages"
                        )
                    needs.add("vision")
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
        elif content is not None:
            raise BadRequest("content must be a string or a list of parts", param="messages")
    return "\n".join(parts).encode(), frozenset(needs)


def _prompt_key(prompt: str | list[str] | list[int] | list[list[int]]) -> bytes:
    """The prompt as the index keys it (its types checked already, schema.py): the first of a
    batch."""
    if isinstance(prompt, str):
        return prompt.encode()
    first = prompt[0]
    if isinstance(first, str):
        return first.encode()
    if isinstance(first, list):
        return _ids(first)
    return _ids(prompt)  # type: ignore[arg-type]


def _batch(prompt: str | list[str] | list[int] | list[list[int]]) -> int:
    """How many prompts: a list of texts, or of token lists, is a batch."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return len(prompt)
    return 1


def _native_key(params: schema.GenerateParams) -> bytes:
    if params.text is not None:
        return _prompt_key(params.text)
    if params.input_ids is not None:
        return _prompt_key(params.input_ids)
    raise BadRequest("/generate needs text or input_ids", param="text")


def _ids(ids: list[int]) -> bytes:
    """Token ids as bytes, four a token, so a block of the index covers whole tokens."""
    return array("i", ids).tobytes()
