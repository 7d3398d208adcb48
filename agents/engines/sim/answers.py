"""What the simulator's OpenAI endpoints take and how their answers are shaped: the request
bodies, and what differs between chat and completions (object names, where the text goes,
JSON, tool calls, log probabilities, usage), with the failures a marked request is given."""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agents.engines.sim import tokens
from agents.engines.sim.generation import DEFAULT_MAX_NEW_TOKENS, Body
from agents.engines.sim.request import Request
from agents.engines.sim.tool_calls import forced_call


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False
    continuous_usage_stats: bool = False  # each content chunk carries the usage so far


class OpenAiBody(Body):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    stream_options: StreamOptions | None = None
    logprobs: bool | int | None = None
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None

    @property
    def limit(self) -> int:
        """sglang-router rewrites chat `max_tokens` as `max_completion_tokens`: read both."""
        for value in (self.max_completion_tokens, self.max_tokens):
            if value is not None:
                return value
        return DEFAULT_MAX_NEW_TOKENS


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatBody(OpenAiBody):
    messages: list[ChatMessage] = Field(min_length=1)
    continue_final_message: bool = False  # a last assistant message is the answer so far


class CompletionBody(OpenAiBody):
    prompt: str | list[str] | list[int] | list[list[int]]


FAILS = ("json", "tool", "length", "logprob")
WEAK_SHIFT = 8.0  # a marked `logprob` failure: log-probabilities this much lower


def weakness(marker: str | None, prompt: str) -> str | None:
    """How a request marked `<marker>:<way>` in its prompt fails on this engine (started with
    --fail-marker): `json` (an answer asked for as JSON is not), `tool` (a call to a tool it
    was not offered), `length` (it ends on the length cap: the engine's other whole answers
    end as on their end token, `stop`), `logprob` (its tokens' log probabilities are low).
    Tiered routes' cascades are tested with it."""
    if marker is None:
        return None
    at = prompt.find(marker + ":")
    if at < 0:
        return None
    rest = prompt[at + len(marker) + 1 :]
    return next((way for way in FAILS if rest.startswith(way)), None)


class Shape:
    """What differs between chat and completions: object names and where the text goes."""

    def __init__(
        self,
        chat: bool,
        served: str,
        report_cache: bool,
        rid: str | None,
        after: str,
        body: OpenAiBody | None = None,
        fail: str | None = None,
        marked: bool = False,
    ) -> None:
        self.chat, self.report_cache = chat, report_cache
        # SGLang checks no `model`: it echoes what it was asked for
        self.served = body.model if body is not None and body.model else served
        # SGLang's answers carry the request's id (`meta_info.id`): the rid, when it is given
        self.id = rid or f"{'chatcmpl' if chat else 'cmpl'}-{time.time_ns():x}"
        self.created = int(time.time())
        self.after = after  # the prompt's text, which the answer's text follows
        self.fail = fail
        self.marked = marked
        form = (body.response_format or {}) if body is not None else {}
        self.json = form.get("type") in ("json_object", "json_schema") and fail != "json"
        self.logprobs = bool(body is not None and body.logprobs)
        self.tools = bool(body is not None and body.tools)
        # SGLang constrains a chat whose tool_choice is "required" or names a function to a
        # call (of the named one, or of any offered), with arguments its schema admits
        self.forced = (forced_call(body.tools, body.tool_choice)
                       if body is not None and chat and fail != "tool" else None)  # fmt: skip

    def whole(self, request: Request, reason: str | None, shift: float) -> dict[str, Any]:
        """A non-streamed answer's choice: JSON when asked for it, and what a marked request
        gets wrong."""
        text = self.text(request, 0, request.generated)
        if self.json:
            text = json.dumps({"answer": text})
        if self.marked and reason == "length":
            # an engine that fails marked requests ends the others as if on their end token
            reason = "length" if self.fail == "length" else "stop"
        choice = self.choice(text, reason, streaming=False, first=True)
        call = self.call()
        if call is not None:
            choice["message"]["tool_calls"] = [{"id": "call_0", "type": "function",
                                                "function": call, "index": 0}]  # fmt: skip
            choice["message"]["content"] = None
            choice["finish_reason"] = "tool_calls"
        if self.logprobs:
            if self.fail == "logprob":
                shift += WEAK_SHIFT
            ids = request.prompt + request.output[: request.generated]
            values = tokens.token_logprobs(ids, len(request.prompt), shift)
            words = [tokens.decode([t], "w") for t in request.output[: request.generated]]
            if self.chat:
                choice["logprobs"] = {"content": [
                    {"token": w, "logprob": v, "bytes": None, "top_logprobs": []}
                    for w, v in zip(words, values, strict=True)
                ]}  # fmt: skip
            else:
                choice["logprobs"] = {"tokens": words, "token_logprobs": values,
                                      "text_offset": None, "top_logprobs": None}  # fmt: skip
        return choice

    def call(self) -> dict[str, str] | None:
        """The tool call this answer is, if it is one: a marked failure's call of a tool not
        offered, or the call a forced tool_choice makes."""
        if self.chat and self.fail == "tool" and self.tools:
            return {"name": "no_such_tool", "arguments": "{}"}
        return self.forced

    def text(self, request: Request, start: int, end: int) -> str:
        after = self.after if start == 0 else "w"  # later chunks follow a word of the answer
        return tokens.decode(request.output[start:end], after)

    def head(self, streaming: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        if streaming and self.chat:
            kind = "chat.completion.chunk"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.served}

    def choice(
        self, text: str, finish: str | None, *, streaming: bool, first: bool
    ) -> dict[str, Any]:
        """A choice as SGLang 0.5.23 shapes it: every chat delta and message carries
        `reasoning_content` (null), a message no `tool_calls` key unless it calls one."""
        body: dict[str, Any] = {"index": 0}
        if not self.chat:
            body["text"] = text
        elif streaming:
            body["delta"] = {"reasoning_content": None}
            if first:
                body["delta"]["role"] = "assistant"
            if first or text or finish is None:
                body["delta"]["content"] = text
        else:
            body["message"] = {"role": "assistant", "content": text, "reasoning_content": None}
        body.update(logprobs=None, finish_reason=finish, matched_stop=None)
        return body

    def usage(
        self, request: Request, details: bool = True, generated: int | None = None
    ) -> dict[str, Any]:
        """`generated`: the tokens so far (a stream's continuous usage); default: all."""
        prompt = len(request.prompt)
        completion = request.generated if generated is None else generated
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": (
                {"cached_tokens": request.cached} if self.report_cache else None
            ),
            "reasoning_tokens": 0,
        }
        if details:
            usage["completion_tokens_details"] = None
        return usage
