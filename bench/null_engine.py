"""A null engine: SGLang's endpoints, answering every request at once with the same few tokens,
so that what a router adds is all there is to measure.

`python -m bench.null_engine --port P` serves /ready, /health, /server_info, /model_info, /v1/loads,
/v1/models, /v1/chat/completions and /v1/completions (streamed or not). It reports the
simulator's model directory, so sglang-router finds a tokenizer there offline.
"""

from __future__ import annotations

import argparse
import time

import orjson
import uvloop
from aiohttp import web

from agents.engines.sim.tokens import MODEL_DIR

MODEL = "llama"
CONTENT = "null"
CHUNK = orjson.dumps({
    "id": "null", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
    "choices": [{"index": 0, "delta": {"role": "assistant", "content": CONTENT},
                 "finish_reason": None}],
})  # fmt: skip
END = orjson.dumps({
    "id": "null", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
    "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
})  # fmt: skip
USAGE = orjson.dumps({
    "id": "null", "object": "chat.completion.chunk", "created": 0, "model": MODEL, "choices": [],
    "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
})  # fmt: skip
STREAM = b"data: " + CHUNK + b"\n\ndata: " + END + b"\n\ndata: " + USAGE + b"\n\ndata: [DONE]\n\n"
ANSWER = orjson.dumps({
    "id": "null", "object": "chat.completion", "created": 0, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": CONTENT},
                 "finish_reason": "length"}],
    "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
})  # fmt: skip


async def generate(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    if b'"stream":true' in body.replace(b" ", b""):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(STREAM)
        await response.write_eof()
        return response
    return web.Response(body=ANSWER, content_type="application/json")


def _json(data: object) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type="application/json")


def app() -> web.Application:
    path = str(MODEL_DIR)
    info = {"model_path": path, "tokenizer_path": path, "served_model_name": MODEL,
            "version": "null", "max_total_num_tokens": 100_000,
            "internal_states": [{}]}  # fmt: skip
    model = {"model_path": path, "tokenizer_path": path, "is_generation": True,
             "model_type": "llama", "architectures": ["LlamaForCausalLM"]}  # fmt: skip
    models = {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "null"}]}

    async def health(_: web.Request) -> web.Response:
        return web.Response()

    async def load(_: web.Request) -> web.Response:
        return _json({"version": "null", "loads": [{
            "timestamp": time.time(), "dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0,
            "num_waiting_uncached_tokens": 0, "num_used_tokens": 0,
            "max_total_num_tokens": 100_000, "gen_throughput": 0.0}]})  # fmt: skip

    application = web.Application()
    application.router.add_get("/ready", health)
    application.router.add_get("/health", health)
    application.router.add_get("/health_generate", health)
    application.router.add_get("/server_info", lambda _: _json(info))  # type: ignore[arg-type,return-value]
    application.router.add_get("/get_server_info", lambda _: _json(info))  # type: ignore[arg-type,return-value]
    application.router.add_get("/model_info", lambda _: _json(model))  # type: ignore[arg-type,return-value]
    application.router.add_get("/get_model_info", lambda _: _json(model))  # type: ignore[arg-type,return-value]
    application.router.add_get("/v1/loads", load)
    application.router.add_get("/v1/models", lambda _: _json(models))  # type: ignore[arg-type,return-value]
    application.router.add_post("/v1/chat/completions", generate)
    application.router.add_post("/v1/completions", generate)
    application.router.add_post("/abort_request", health)
    return application


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    options = parser.parse_args()
    uvloop.install()
    web.run_app(app(), host=options.host, port=options.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
