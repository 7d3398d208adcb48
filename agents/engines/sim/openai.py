"""`/v1/completions` and `/v1/chat/completions` in SGLang's OpenAI shapes, streamed or not."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from agents.engines.sim import tokens
from agents.engines.sim.engine import Engine
from agents.engines.sim.generation import (
    DEFAULT_MAX_NEW_TOKENS,
    Body,
    Kv,
    finished,
    parse,
    progress,
    start,
)
from agents.engines.sim.request import Request
from agents.engines.sim.tool_calls import forced_call


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


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

    def usage(self, request: Request, details: bool = True) -> dict[str, Any]:
        prompt, completion = len(request.prompt), request.generated
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


async def chat(
    http: HttpRequest,
    engine: Engine,
    kv: Kv,
    served: str,
    report_cache: bool,
    fail_marker: str | None = None,
) -> Response:
    body = await parse(http, ChatBody)
    messages = [m.model_dump() for m in body.messages]
    text = tokens.chat_prompt(messages, continue_final=body.continue_final_message)
    fail = weakness(fail_marker, text)
    shape = Shape(True, served, report_cache, body.rid, text, body, fail, fail_marker is not None)
    return await _answer(engine, kv, body, tokens.encode(text), shape)


async def completions(
    http: HttpRequest,
    engine: Engine,
    kv: Kv,
    served: str,
    report_cache: bool,
    fail_marker: str | None = None,
) -> Response:
    body = await parse(http, CompletionBody)
    prompts: list[tuple[str, list[int]]] = []  # each prompt's text (if any) and its tokens
    if isinstance(body.prompt, str):
        prompts.append((body.prompt, tokens.encode(body.prompt)))
    elif body.prompt and all(isinstance(p, str) for p in body.prompt):
        prompts.extend((str(p), tokens.encode(str(p))) for p in body.prompt)
    elif body.prompt and all(isinstance(p, list) for p in body.prompt):
        prompts.extend(("", [int(i) for i in p]) for p in body.prompt)  # type: ignore[union-attr]
    else:
        prompts.append(("", [int(i) for i in body.prompt]))  # type: ignore[arg-type]
    marked = fail_marker is not None
    if len(prompts) == 1:
        text, prompt = prompts[0]
        fail = weakness(fail_marker, text)
        shape = Shape(False, served, report_cache, body.rid, text, body, fail, marked)
        return await _answer(engine, kv, body, prompt, shape)
    # a batch, as SGLang serves one: a request per prompt (rid `<rid>_<i>`), choice i of one
    # answer, the usage summed; streamed, each prompt's chunks under its own id
    shapes = [Shape(False, served, report_cache, f"{body.rid}_{i}" if body.rid else None, text,
                    body, weakness(fail_marker, text), marked)
              for i, (text, _) in enumerate(prompts)]  # fmt: skip
    requests = [engine.new_request(p, body.limit, shape.id) for (_, p), shape in
                zip(prompts, shapes, strict=True)]  # fmt: skip
    for request in requests:
        await start(engine, kv, body, request)
    if body.stream:
        usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(
            _stream_batch(engine, requests, shapes, usage), media_type="text/event-stream"
        )
    choices = []
    for i, (request, shape) in enumerate(zip(requests, shapes, strict=True)):
        await finished(engine, request)
        choices.append(shape.whole(request, _reason(request), engine.faults.shift) | {"index": i})
    answer = shapes[0].head(streaming=False)
    answer["choices"] = choices
    answer["usage"] = _summed([s.usage(r) for s, r in zip(shapes, requests, strict=True)])
    versions = [{"version": "default", "start": 0, "end": requests[0].generated}]
    answer["metadata"] = {"weight_version": "default", "weight_versions": versions}
    return JSONResponse(answer)


async def _stream_batch(
    engine: Engine, requests: list[Request], shapes: list[Shape], usage: bool
) -> AsyncIterator[bytes]:
    """A batch's prompts streamed together: each chunk carries its prompt's id and index."""
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def one(i: int) -> None:
        try:
            async for event in _stream(engine, requests[i], shapes[i], usage=False):
                if event != b"data: [DONE]\n\n":
                    await queue.put(event.replace(b'"index":0', b'"index":%d' % i, 1))
        finally:
            await queue.put(None)

    tasks = [asyncio.ensure_future(one(i)) for i in range(len(requests))]
    try:
        left = len(tasks)
        while left:
            event = await queue.get()
            if event is None:
                left -= 1
            else:
                yield event
    finally:
        for task in tasks:
            task.cancel()
    if usage:
        chunk = shapes[0].head(streaming=True)
        chunk["choices"] = []
        chunk["usage"] = _summed([s.usage(r, details=False) for s, r in
                                  zip(shapes, requests, strict=True)])  # fmt: skip
        yield _event(chunk)
    yield b"data: [DONE]\n\n"


def _summed(usages: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(usages[0])
    for key in ("prompt_tokens", "total_tokens", "completion_tokens"):
        out[key] = sum(u[key] for u in usages)
    details = [u.get("prompt_tokens_details") for u in usages]
    if all(isinstance(d, dict) for d in details):
        out["prompt_tokens_details"] = {"cached_tokens": sum(d["cached_tokens"] for d in details)}  # type: ignore[index]
    return out


async def _answer(
    engine: Engine, kv: Kv, body: OpenAiBody, prompt: list[int], shape: Shape
) -> Response:
    request = engine.new_request(prompt, body.limit, body.rid)
    await start(engine, kv, body, request)
    if body.stream:
        usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(
            _stream(engine, request, shape, usage), media_type="text/event-stream"
        )
    await finished(engine, request)
    answer = shape.head(streaming=False)
    answer["choices"] = [shape.whole(request, _reason(request), engine.faults.shift)]
    answer["usage"] = shape.usage(request)
    versions = [{"version": "default", "start": 0, "end": request.generated}]
    answer["metadata"] = {"weight_version": "default", "weight_versions": versions}
    return JSONResponse(answer)


async def _stream(
    engine: Engine, request: Request, shape: Shape, usage: bool
) -> AsyncIterator[bytes]:
    """Chat: a first chunk with the role, content chunks (or a tool call's), then the finish
    reason in a chunk of its own. Completions: text chunks each with `"usage": null`, the
    finish reason on the last. Then, when asked, the usage in a chunk with no choices."""
    call = shape.call()
    if call is not None:
        async for event in _stream_call(engine, request, shape, call, usage):
            yield event
        return
    sent = 0
    async for count in progress(engine, request):
        if not sent and shape.chat:  # with the first token, SGLang's role chunk (no content)
            chunk = shape.head(streaming=True)
            chunk["choices"] = [shape.choice("", None, streaming=True, first=True)]
            yield _event(chunk)
        reason = None if shape.chat else _reason(request)
        if count > sent or reason is not None:
            text, sent = shape.text(request, sent, count), count
            chunk = shape.head(streaming=True)
            chunk["choices"] = [shape.choice(text, reason, streaming=True, first=False)]
            if not shape.chat:
                chunk["usage"] = None
            yield _event(chunk)
    if shape.chat:
        chunk = shape.head(streaming=True)
        chunk["choices"] = [shape.choice("", _reason(request), streaming=True, first=False)]
        yield _event(chunk)
    if usage:
        yield _usage_event(shape, request)
    yield b"data: [DONE]\n\n"


async def _stream_call(
    engine: Engine, request: Request, shape: Shape, call: dict[str, str], usage: bool
) -> AsyncIterator[bytes]:
    """A tool call, streamed as SGLang streams one: the role, the call's name with its
    arguments, and the finish reason `tool_calls`, once the engine has generated it."""
    async for _ in progress(engine, request):
        pass
    chunk = shape.head(streaming=True)
    chunk["choices"] = [shape.choice("", None, streaming=True, first=True)]
    yield _event(chunk)
    chunk = shape.head(streaming=True)
    delta = {"role": None, "content": None, "reasoning_content": None, "tool_calls": [
        {"id": "call_0", "index": 0, "type": "function", "function": call}]}  # fmt: skip
    chunk["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None,
                         "matched_stop": None}]  # fmt: skip
    yield _event(chunk)
    chunk = shape.head(streaming=True)
    chunk["choices"] = [shape.choice("", "tool_calls", streaming=True, first=False)]
    yield _event(chunk)
    if usage:
        yield _usage_event(shape, request)
    yield b"data: [DONE]\n\n"


def _usage_event(shape: Shape, request: Request) -> bytes:
    """The usage, in a chunk with no choices, when the client asked for it."""
    chunk = shape.head(streaming=True)
    chunk["choices"] = []
    chunk["usage"] = shape.usage(request, details=shape.chat)
    return _event(chunk)


def _reason(request: Request) -> str | None:
    return request.finish if request.finish in ("length", "abort", "stop") else None


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
