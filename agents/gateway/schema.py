"""The inference requests the gateway takes, as OpenAI (and SGLang's /generate) define them:
the types and ranges of their parameters, checked before anything is reserved, and the
OpenAPI document of the agent's port made from the same models.

On the request path only the `*Params` models run, over the parsed body, in pydantic's strict
mode (a string is not a number, 1 is not true); they read the fields they name and ignore
the rest, which pass on to the engine (SGLang takes more than OpenAI). A chat's messages are
checked where they are read, once (requests.py); the `*Request` models describe them, and
the model's name, for the document.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents.gateway.errors import BadRequest

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
MAX_N = 1  # one choice a request: the router prices one answer (send n requests for n)

Penalty = Annotated[float, Field(ge=-2, le=2)]
TokenId = Annotated[int, Field(ge=0, lt=2**31)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
MAX_BATCH = 64  # prompts in one completions request (SGLang serves them as a batch)
Texts = Annotated[list[str], Field(min_length=1, max_length=MAX_BATCH)]
Tokens = Annotated[int, Field(ge=0)]
MAX_STOPS = 4
Stop = str | Annotated[list[str], Field(max_length=MAX_STOPS)]


class _Params(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    include_usage: bool = False


class FunctionSpec(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    type: Literal["function"]
    function: FunctionSpec


class _Sampling(_Params):
    """What chat and completions share."""

    max_tokens: Tokens | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    n: int | None = Field(default=None, ge=1, le=MAX_N)
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    stop: Stop | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=256)


class ChatParams(_Sampling):
    max_completion_tokens: Tokens | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None


class CompletionParams(_Sampling):
    prompt: (
        str
        | Texts
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_BATCH)]
    )
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool | None = None
    best_of: int | None = Field(default=None, ge=1, le=MAX_N)
    suffix: str | None = None


class SamplingParams(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    max_new_tokens: Tokens | None = None
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    n: int | None = Field(default=None, ge=1, le=MAX_N)
    stop: Stop | None = None


class GenerateParams(_Params):
    text: str | Texts | None = None
    input_ids: TokenIds | Annotated[list[TokenIds], Field(min_length=1)] | None = None
    sampling_params: SamplingParams | None = None
    stream: bool = False
    return_logprob: bool | None = None


# the whole requests, for the document

ContentPart = dict[str, Any]


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None


class ChatRequest(ChatParams):
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)


class CompletionRequest(CompletionParams):
    model: str = Field(min_length=1)


class GenerateRequest(GenerateParams):
    model: str | None = None


_TYPES = frozenset({"str", "int", "float", "bool", "none"})


def _union_member(part: str | int) -> bool:
    return isinstance(part, str) and (part in _TYPES or "[" in part)


PARAMS: dict[str, type[_Params]] = {
    "/v1/chat/completions": ChatParams,
    "/v1/completions": CompletionParams,
    "/generate": GenerateParams,
}


def checked(path: str, body: dict[str, Any]) -> _Params:
    """The body's parameters, or BadRequest naming the first one out of range or of the wrong
    type (`param` as OpenAI names it: `tools.0.function.name`)."""
    try:
        params = PARAMS[path].model_validate(body)
    except ValidationError as error:
        errors = error.errors(include_url=False, include_input=False)
        # of a union's members, the one of the value's own type says what is wrong with it
        # (a list of 5 stop strings is too long, not "not a string")
        first = next((e for e in errors if e["loc"][0] == errors[0]["loc"][0]
                      and not e["type"].endswith("_type")), errors[0])  # fmt: skip
        # a union's members report under their types' names: the field is what is named
        param = ".".join(str(part) for part in first["loc"] if not _union_member(part))
        message = f"{param}: {first['msg']}"
        if first["loc"][-1] in ("n", "best_of") and first["type"] == "less_than_equal":
            message = f"{param}: one choice a request here; send n requests for n choices"
        elif param.endswith("stop") and first["type"] == "too_long":
            message = f"{param}: up to {MAX_STOPS} stop sequences (as OpenAI allows)"
        raise BadRequest(message, param=param) from None
    if isinstance(params, ChatParams) and params.top_logprobs and not params.logprobs:
        raise BadRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    return params
