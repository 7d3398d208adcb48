"""SGLang's native `/generate`: text or input_ids in, cumulative text and output_ids out.

With `return_logprob`, meta_info carries `output_token_logprobs` and, from prompt position
`logprob_start_len` (-1, the default: none), `input_token_logprobs`: [logprob, token id,
text] each, the text only with `return_text_in_logprobs`, and the first prompt token's
logprob None, as SGLang answers. A prompt scored with `max_new_tokens` 0 is teacher
forcing: the log-probabilities of a reference continuation given what precedes it. Each
value carries a little noise, as a real engine's batching makes it vary from run to run.
"""

from __future__ import annotations

import json
import random
import time
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
    return_logprob: bool = False
    logprob_start_len: int = Field(default=-1, ge=-1)
    return_text_in_logprobs: bool = False

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


LOGPROB_NOISE = 0.002  # the run-to-run spread of a value, as batching makes it


def _logprobs(
    ids: list[int], values: list[float | None], text: bool, noise: random.Random
) -> list[list[Any]]:
    return [[None if v is None else round(v + noise.uniform(-LOGPROB_NOISE, LOGPROB_NOISE), 6),
             i, tokens.decode([i]) if text else None]
            for v, i in zip(values, ids, strict=True)]  # fmt: skip


def logprob_info(
    request: Request, body: GenerateBody, shift: float, noise: random.Random
) -> dict[str, Any]:
    """meta_info's log-probabilities of the prompt (from `logprob_start_len`) and of what was
    generated so far."""
    text = body.return_text_in_logprobs
    prompt, out = request.prompt, request.output[: request.generated]
    start = body.logprob_start_len
    scored = prompt[start:] if start >= 0 else []
    given = tokens.token_logprobs(prompt, start, shift) if start >= 0 else []
    made = tokens.token_logprobs(prompt + out, len(prompt), shift)
    return {
        "input_token_logprobs": _logprobs(scored, given, text, noise),
        "output_token_logprobs": _logprobs(out, made, text, noise),
    }


def generate_result(
    request: Request, *, elapsed_s: float, after: str, frame: str = "whole"
) -> dict[str, Any]:
    """`after`: the prompt's text, which the answer's follows. `frame`: "whole" (an answer,
    or a stream's last frame), "first" or "middle" (a stream's), whose meta_info SGLang
    0.5.23 shapes apart: the first carries when it was sent, the last its latencies."""
    ids = request.output[: request.generated]
    now = time.time()
    queued = (request.admitted or request.arrived) - request.arrived
    meta: dict[str, Any] = {
        "id": request.rid,
        "finish_reason": finish_reason(request),
        "prompt_tokens": len(request.prompt),
        "weight_version": "default",
        "num_retractions": 0,
        "storage_prefetch_wait": 0.0,
        "storage_staging_wait": 0.0,
        "forward_entry_time": now - elapsed_s + queued,
        "prefill_finished_time": now - elapsed_s + queued,
        "queue_time": queued,
        "reasoning_tokens": 0,
        "completion_tokens": request.generated,
        "cached_tokens": request.cached,
    }
    if frame == "whole":
        meta["weight_versions"] = [{"version": "default", "start": 0, "end": request.generated}]
    details = {"device": request.cached, "host": 0} if request.cached else None
    meta.update(cached_tokens_details=details, dp_rank=None)
    if frame == "whole":
        first = request.first_token_at
        meta.update(
            e2e_latency=elapsed_s,
            request_received_ts=now - elapsed_s,
            first_token_latency=(first - request.arrived) if first is not None else None,
            api_server_dispatch_finish_ts=now - elapsed_s,
        )
    if frame != "middle":
        meta["response_sent_to_client_ts"] = now
    if frame == "whole":
        decode_s = elapsed_s - (meta["first_token_latency"] or 0.0)
        meta.update(
            request_finished_ts=now,
            decode_throughput=request.generated / decode_s if decode_s > 0 else 0.0,
        )
    return {"text": tokens.decode(ids, after), "output_ids": ids, "meta_info": meta}


async def generate(http: HttpRequest, engine: Engine, kv: Kv) -> Response:
    """Errors before the answer starts in the native shape, {"error": {"message"}}."""
    try:
        return await _generate(http, engine, kv)
    except SimError as error:
        error.native = True
        raise


async def _generate(http: HttpRequest, engine: Engine, kv: Kv) -> Response:
    body = await parse(http, GenerateBody)
    prompts = body.prompts()
    if body.batched and body.stream:
        raise SimError(400, "the simulator streams one prompt at a time")
    max_new = body.sampling_params.max_new_tokens
    max_new = DEFAULT_MAX_NEW_TOKENS if max_new is None else max_new
    requests = [
        engine.new_request(p, max_new, body.rid if i == 0 else None, body.salt(i))
        for i, p in enumerate(prompts)
    ]
    for request in requests:
        await start(engine, kv, body, request)
    if body.stream:
        stream = _stream(engine, requests[0], body, body.texts()[0])
        return StreamingResponse(stream, media_type="text/event-stream")
    for request in requests:
        await finished(engine, request)
    texts = body.texts()
    results = [_result(engine, r, body, texts[i]) for i, r in enumerate(requests)]
    return JSONResponse(results if body.batched else results[0])


def _result(
    engine: Engine, request: Request, body: GenerateBody, after: str, frame: str = "whole"
) -> dict[str, Any]:
    elapsed_s = engine.now() - request.arrived
    result = generate_result(request, elapsed_s=elapsed_s, after=after, frame=frame)
    if body.return_logprob:
        shift = engine.faults.shift
        result["meta_info"].update(logprob_info(request, body, shift, engine.noise))
    return result


async def _stream(
    engine: Engine, request: Request, body: GenerateBody, after: str
) -> AsyncIterator[bytes]:
    frame = "first"
    async for _ in progress(engine, request):
        chunk = _result(engine, request, body, after, "whole" if request.done else frame)
        frame = "middle"
        yield b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"
