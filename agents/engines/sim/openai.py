"""`/v1/completions` and `/v1/chat/completions` in SGLang's OpenAI shapes, streamed or not."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from agents.engines.sim import tokens
from agents.engines.sim.answers import ChatBody, CompletionBody, OpenAiBody, Shape, weakness
from agents.engines.sim.engine import Engine
from agents.engines.sim.generation import Kv, finished, parse, progress, start
from agents.engines.sim.request import Request


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
    requests = [engine.new_request(p, body.limit, shape.id, body.salt(i))
                for i, ((_, p), shape) in enumerate(zip(prompts, shapes, strict=True))]  # fmt: skip
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
    request = engine.new_request(prompt, body.limit, body.rid, body.salt())
    await start(engine, kv, body, request)
    if body.stream:
        options = body.stream_options
        usage = options is not None and options.include_usage
        continuous = options is not None and options.continuous_usage_stats
        return StreamingResponse(
            _stream(engine, request, shape, usage, continuous), media_type="text/event-stream"
        )
    await finished(engine, request)
    answer = shape.head(streaming=False)
    answer["choices"] = [shape.whole(request, _reason(request), engine.faults.shift)]
    answer["usage"] = shape.usage(request)
    versions = [{"version": "default", "start": 0, "end": request.generated}]
    answer["metadata"] = {"weight_version": "default", "weight_versions": versions}
    return JSONResponse(answer)


async def _stream(
    engine: Engine, request: Request, shape: Shape, usage: bool, continuous: bool = False
) -> AsyncIterator[bytes]:
    """Chat: a first chunk with the role, content chunks (or a tool call's), then the finish
    reason in a chunk of its own. Completions: text chunks each with `"usage": null`, the
    finish reason on the last. Then, when asked, the usage in a chunk with no choices.
    `continuous` (`stream_options.continuous_usage_stats`): each content chunk carries the
    usage so far instead, as SGLang's do."""
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
            if continuous:  # SGLang's: a completion's says nothing of the cache here
                chunk["usage"] = shape.usage(request, generated=count)
                if not shape.chat:
                    chunk["usage"]["prompt_tokens_details"] = None
            elif not shape.chat:
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
