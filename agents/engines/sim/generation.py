"""What every generation endpoint shares: the request bodies, PD hand-over, and progress."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse

from agents.engines.sim.engine import Engine
from agents.engines.sim.metrics import Metrics
from agents.engines.sim.radix import namespace
from agents.engines.sim.request import Request

DEFAULT_MAX_NEW_TOKENS = 128
KV_WAIT_S = 30.0


class SimError(Exception):
    """Answered in SGLang's error shapes: on the OpenAI routes {"object": "error", "message",
    "type", "param", "code"}; on the native ones (`native`) {"error": {"message"}}."""

    def __init__(self, status: int, message: str, kind: str = "Bad Request") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.native = False

    def response(self) -> JSONResponse:
        if self.native:
            return JSONResponse({"error": {"message": self.message}}, status_code=self.status)
        body = {"object": "error", "message": self.message, "type": self.kind, "param": None,
                "code": self.status}  # fmt: skip
        return JSONResponse(body, status_code=self.status)


class Body(BaseModel):
    """Unknown fields are accepted, as SGLang accepts them."""

    model_config = ConfigDict(extra="allow")

    stream: bool = False
    rid: str | None = None
    priority: int | None = None  # read when the engine schedules by priority
    cache_salt: str | list[str] | None = None  # a prefix is cached per salt (a list: a prompt's)
    bootstrap_host: str | None = None
    bootstrap_port: int | None = Field(default=None, ge=1, le=65535)
    bootstrap_room: int | None = Field(default=None, ge=0)
    lora_path: str | list[str | None] | None = None  # its LoRA adapter (a list: a prompt's)

    def salt(self, i: int = 0) -> str | None:
        """The cache namespace of the request's `i`th prompt: its salt, and its adapter."""
        salt = self.cache_salt
        if isinstance(salt, list):
            salt = salt[i] if i < len(salt) else None
        return namespace(salt, self.adapter(i))

    def adapter(self, i: int = 0) -> str | None:
        """The LoRA adapter of its `i`th prompt: `model` as `base:adapter` wins (as in
        agents/engines/sim/lora.py), else `lora_path`."""
        model = getattr(self, "model", None)
        if isinstance(model, str) and ":" in model and model.split(":", 1)[1].strip():
            return model.split(":", 1)[1].strip()
        path = self.lora_path
        if isinstance(path, list):
            path = path[i] if i < len(path) else None
        return path or None


B = TypeVar("B", bound=BaseModel)


async def parse(http: HttpRequest, model: type[B]) -> B:
    if "json" not in http.headers.get("content-type", ""):
        raise SimError(400, "the request body must be JSON (Content-Type: application/json)")
    try:
        return model.model_validate(json.loads(await http.body()))
    except json.JSONDecodeError as error:
        raise SimError(400, f"the body is not valid JSON: {error}") from error
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise SimError(400, f"{where}: {first['msg']}") from error


@dataclass
class Kv:
    """PD: where prefilled KV caches are announced (prefill role) and fetched (decode role)."""

    metrics: Metrics
    ready: dict[int, int]  # bootstrap room -> prompt tokens, on a prefill server
    arrived: asyncio.Condition
    announcing: set[asyncio.Task[None]]  # held here: the loop keeps only weak references

    @classmethod
    def new(cls, metrics: Metrics) -> Kv:
        return cls(metrics, {}, asyncio.Condition(), set())

    async def publish(self, room: int, tokens: int) -> None:
        async with self.arrived:
            self.ready[room] = tokens
            self.metrics.prefill_inflight = len(self.ready)
            self.arrived.notify_all()

    async def take(self, room: int, timeout_s: float) -> int | None:
        """The prefill side of a fetch: wait for the room's prefill, then hand it over."""
        async with self.arrived:
            try:
                await asyncio.wait_for(self.arrived.wait_for(lambda: room in self.ready), timeout_s)
            except TimeoutError:
                return None
            tokens = self.ready.pop(room)
            self.metrics.prefill_inflight = len(self.ready)
            return tokens


async def start(engine: Engine, kv: Kv, body: Body, request: Request) -> None:
    """Queue a request; in decode role, after its KV cache has come from the prefill server,
    or prefilled here when the request names no prefill server (the router's local prefill
    of a short or mostly cached prompt)."""
    if not request.prompt:  # SGLang refuses a prompt of no tokens too
        raise SimError(400, "the input is empty: it has no tokens")
    if any(r.rid == request.rid for r in (*engine.waiting, *engine.running)):
        # as SGLang 0.5.23 refuses a rid it is serving (measured)
        raise SimError(400, f"Duplicate request ID detected: {request.rid}", "BadRequestError")
    request.streaming = body.stream
    request.priority = body.priority
    pd = (body.bootstrap_host, body.bootstrap_port, body.bootstrap_room)
    if engine.role == "decode" and any(v is not None for v in pd):
        await _receive_kv(engine, kv, body, request)
    engine.submit(request)
    if engine.role == "prefill" and body.bootstrap_room is not None:
        task = asyncio.get_running_loop().create_task(_announce(kv, body.bootstrap_room, request))
        kv.announcing.add(task)
        task.add_done_callback(kv.announcing.discard)


async def _announce(kv: Kv, room: int, request: Request) -> None:
    await request.ended.wait()
    if request.finish == "length":
        await kv.publish(room, len(request.prompt))


async def _receive_kv(engine: Engine, kv: Kv, body: Body, request: Request) -> None:
    if body.bootstrap_host is None or body.bootstrap_port is None or body.bootstrap_room is None:
        raise SimError(400, "a decode server needs bootstrap_host, bootstrap_port, bootstrap_room")
    url = f"http://{body.bootstrap_host}:{body.bootstrap_port}/kv/{body.bootstrap_room}"
    kv.metrics.transfer_queue += 1
    started = engine.now()
    try:
        async with httpx.AsyncClient(timeout=KV_WAIT_S + 5) as client:
            answer = await client.get(url, params={"timeout_s": KV_WAIT_S})
        if answer.status_code != 200:
            raise SimError(
                503, f"no KV cache from the prefill server: {answer.text}", "ServiceUnavailable"
            )
        await asyncio.sleep(engine.cost.kv_transfer(int(answer.json()["tokens"])))
    except httpx.HTTPError as error:
        raise SimError(
            503, f"the prefill server is unreachable: {error}", "ServiceUnavailable"
        ) from error
    finally:
        kv.metrics.transfer_queue -= 1
    kv.metrics.transferred((engine.now() - started) * 1000)
    request.prefilled = True


async def progress(engine: Engine, request: Request) -> AsyncIterator[int]:
    """The generated count at each change the stream interval lets through; aborts if dropped."""
    sent = 0
    try:
        while not request.done:
            await request.changed.wait()
            request.changed.clear()
            if request.generated > sent or request.done:
                sent = request.generated
                yield sent
    finally:
        if not request.done:
            engine.abort(request)


async def finished(engine: Engine, request: Request) -> None:
    try:
        await request.ended.wait()
    finally:
        if not request.done:
            engine.abort(request)


def finish_reason(request: Request) -> dict[str, Any] | None:
    if request.finish == "length":
        return {"type": "length", "length": request.generated}
    if request.finish == "abort":
        return {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
    return None
