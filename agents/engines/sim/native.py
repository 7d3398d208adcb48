"""SGLang's native `/generate`: text or input_ids in, cumulative text and output_ids out."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from agents.engines.sim import tokens
from agents.engines.sim.engine import Engine
from agents.engines.sim.generation import (
    DEFAULT_MAX_NEW_TOKENS,
    Body,
    Kv,
    SimError,
    finish_reason,
    finished,
    parse,
    progress,
    start,
)
from agents.engines.sim.request import Request


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="allow")

    max_new_tokens: int | None = Field(default=DEFAULT_MAX_NEW_TOKENS, ge=0)


class GenerateBody(Body):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)

    @model_validator(mode="after")
    def _one_input(self) -> GenerateBody:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give either text or input_ids")
        return self

    def prompts(self) -> list[list[int]]:
        if self.text is not None:
            texts = [self.text] if isinstance(self.text, str) else self.text
            return [tokens.encode(t) for t in texts]
        ids = self.input_ids or []
        if ids and isinstance(ids[0], list):
            return [list(map(int, one)) for one in ids]
        return [list(map(int, ids))]

    def texts(self) -> list[str]:
        """Each prompt's text, which its answer's text follows ("" for token ids)."""
        if self.text is None:
            return [""] * len(self.prompts())
        return [self.text] if isinstance(self.text, str) else list(self.text)

    @property
    def batched(self) -> bool:
        return isinstance(self.text, list) or bool(
            self.input_ids and isinstance(self.input_ids[0], list)
        )


def generate_result(request: Request, *, elapsed_s: float, after: str) -> dict[str, Any]:
    """`after`: the prompt's text, which the answer's follows."""
    ids = request.output[: request.generated]
    return {
        "text": tokens.decode(ids, after),
        "output_ids": ids,
        "meta_info": {
            "id": request.rid,
            "finish_reason": finish_reason(request),
            "prompt_tokens": len(request.prompt),
            "completion_tokens": request.generated,
            "cached_tokens": request.cached,
            "e2e_latency": elapsed_s,
        },
    }


async def generate(http: HttpRequest, engine: Engine, kv: Kv) -> Response:
    body = await parse(http, GenerateBody)
    prompts = body.prompts()
    if body.batched and body.stream:
        raise SimError(400, "the simulator streams one prompt at a time")
    max_new = body.sampling_params.max_new_tokens
    max_new = DEFAULT_MAX_NEW_TOKENS if max_new is None else max_new
    requests = [
        engine.new_request(p, max_new, body.rid if i == 0 else None) for i, p in enumerate(prompts)
    ]
    for request in requests:
        await start(engine, kv, body, request)
    if body.stream:
        stream = _stream(engine, requests[0], body.texts()[0])
        return StreamingResponse(stream, media_type="text/event-stream")
    for request in requests:
        await finished(engine, request)
    texts = body.texts()
    results = [
        generate_result(r, elapsed_s=engine.now() - r.arrived, after=texts[i])
        for i, r in enumerate(requests)
    ]
    return JSONResponse(results if body.batched else results[0])


async def _stream(engine: Engine, request: Request, after: str) -> AsyncIterator[bytes]:
    async for _ in progress(engine, request):
        chunk = generate_result(request, elapsed_s=engine.now() - request.arrived, after=after)
        yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"
