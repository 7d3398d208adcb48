"""The simulator's HTTP server: SGLang's endpoints, its metrics, and an admin endpoint for faults.

POST /sim/faults {"slow_factor": 3, "error_rate": 0.1, "hang": true, "crash": true,
"poison": "text", "output": "garbage", "logprob_shift": 0.5} changes the faults of a running
simulator; GET /sim/faults shows them. A poison is text that kills the engine at once when
an inference request's body holds it, as a request that hits an engine's bug does. The
quality faults keep the engine healthy by every check while it answers wrong: `output`
"garbage" (characters no prompt uses) or "repeat" (one token, "!", over and over), and
`logprob_shift`, wrong weights of adjustable size (tokens.logprob). GET /sim/lora counts
the adapters' loads (the benchmarks' cold loads, wherever they were asked for).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from agents.engines.sim import lora, native, openai
from agents.engines.sim.config import VERSION, SimConfig
from agents.engines.sim.engine import Engine
from agents.engines.sim.generation import Kv, SimError, finished, parse
from agents.engines.sim.kv_events import KvEvents
from agents.engines.sim.lora import Loras, Ref
from agents.engines.sim.metrics import Metrics
from agents.engines.sim.request import EngineBusy, Faults, InjectedError

log = logging.getLogger(__name__)
CRASH_EXIT_CODE = 70


class FaultChange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    slow_factor: float | None = Field(default=None, gt=0, le=1000)
    error_rate: float | None = Field(default=None, ge=0, le=1)
    hang: bool | None = None
    crash: bool = False
    poison: str | None = Field(default=None, min_length=1, max_length=256)
    output: Literal["none", "garbage", "repeat"] | None = None
    logprob_shift: float | None = Field(default=None, ge=0, le=20)


class _UnloadLora(BaseModel):
    lora_name: str = Field(min_length=1, max_length=256)


class _LoadLora(_UnloadLora):
    lora_path: str = Field(min_length=1, max_length=4096)
    pinned: bool = False


class Simulator:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.metrics = Metrics(
            config.served_model_name, config.role, config.enable_priority_scheduling
        )
        self.kv_events = (
            KvEvents(config.kv_events_config, config.page_size)
            if config.kv_events_config is not None
            else None
        )
        self.engine = Engine(
            cost=config.cost(),
            max_running=config.max_running_requests,
            stream_interval=config.stream_interval,
            role=config.role,
            max_prefill_tokens=config.max_prefill_tokens,
            chunked_prefill_size=config.chunked_prefill_size,
            speed=config.speed_factor,
            faults=Faults(config.slow_factor, config.error_rate, config.hang),
            observer=self.metrics,
            seed=config.seed,
            priority=config.priority(),
            listener=self.kv_events,
            max_loras_per_batch=config.max_loras_per_batch if config.enable_lora else None,
        )
        self.engine.set_hang(config.hang)
        self.metrics.engine = self.engine
        self.kv = Kv.new(self.metrics)
        self.loras = Loras(config.enable_lora, config.max_lora_rank, config.max_loaded_loras,
                           config.lora_load_s)  # fmt: skip
        for named in config.lora_paths:
            name, _, path = named.partition("=")
            self.loras.known[name] = Ref(name, path, uuid.uuid4().hex, False)
        self.started = time.time()
        self.ready = False

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self.engine.run()), group.create_task(self._start())]
            if self.config.crash_after_s is not None:
                tasks.append(group.create_task(self._crash_after(self.config.crash_after_s)))
            yield
            for task in tasks:
                task.cancel()
        if self.kv_events is not None:
            self.kv_events.close()

    async def _start(self) -> None:
        await asyncio.sleep(self.config.startup_s)
        self.ready = True
        log.info("simulator ready", extra={"model": self.config.served_model_name})

    async def _crash_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        crash()

    def app(self) -> Starlette:
        routes = [
            Route("/ready", self.ready_check),
            Route("/health", self.health_generate),
            Route("/health_generate", self.health_generate),
            Route("/model_info", self.model_info),
            Route("/get_model_info", self.model_info),
            Route("/server_info", self.server_info),
            Route("/get_server_info", self.server_info),
            Route("/v1/loads", self.load),
            Route("/v1/models", self.models),
            Route("/v1/models/{model:path}", self.model),
            Route(
                "/generate",
                self._inference(lambda r: native.generate(r, self.engine, self.kv), native=True),
                methods=["POST"],
            ),
            Route("/load_lora_adapter", self.load_lora_adapter, methods=["POST"]),
            Route("/unload_lora_adapter", self.unload_lora_adapter, methods=["POST"]),
            Route("/v1/completions", self._inference(self._completions), methods=["POST"]),
            Route("/v1/chat/completions", self._inference(self._chat), methods=["POST"]),
            Route("/flush_cache", self._guard(self.flush_cache), methods=["GET", "POST"]),
            Route("/abort_request", self._guard(self.abort_request), methods=["POST"]),
            Route("/metrics", self.prometheus),
            Route("/sim/faults", self._guard(self.faults), methods=["GET", "POST"]),
            Route("/sim/lora", self._guard(self.lora_loads), methods=["GET"]),
        ]
        return Starlette(routes=routes, lifespan=self.lifespan,
                         exception_handlers={404: _not_found})  # fmt: skip

    def _guard(
        self, handler: Callable[[HttpRequest], Awaitable[Response]]
    ) -> Callable[[HttpRequest], Awaitable[Response]]:
        async def guarded(request: HttpRequest) -> Response:
            try:
                return await handler(request)
            except SimError as error:
                return error.response()
            except InjectedError as error:
                return SimError(500, str(error), "InternalServerError").response()

        return guarded

    def _inference(
        self, handler: Callable[[HttpRequest], Awaitable[Response]], native: bool = False
    ) -> Callable[[HttpRequest], Awaitable[Response]]:
        async def with_adapter(request: HttpRequest) -> Response:
            adapter = lora.asked(await request.body(), self.config.served_model_name, native)
            if adapter is not None:
                try:
                    await self.loras.resolve(adapter)
                except SimError as error:
                    error.native = native
                    raise
            return await handler(request)

        guarded = self._guard(with_adapter)

        async def inference(request: HttpRequest) -> Response:
            poison = self.engine.faults.poison
            if poison is not None and poison.encode() in await request.body():
                crash()
            return await guarded(request)

        return inference

    async def _chat(self, request: HttpRequest) -> Response:
        c = self.config
        return await openai.chat(
            request, self.engine, self.kv, c.served_model_name, c.enable_cache_report,
            c.fail_marker,
        )  # fmt: skip

    async def _completions(self, request: HttpRequest) -> Response:
        c = self.config
        return await openai.completions(
            request, self.engine, self.kv, c.served_model_name, c.enable_cache_report,
            c.fail_marker,
        )  # fmt: skip

    async def ready_check(self, _request: HttpRequest) -> Response:
        """SGLang's cheap check: 503 while starting, then 200. It asks nothing of the
        scheduler, so a hung engine still answers it (its /v1/loads and /health do not)."""
        return Response(status_code=200 if self.ready else 503)

    async def health_generate(self, _request: HttpRequest) -> Response:
        """`/health` and `/health_generate` both run a one-token generation on SGLang
        0.5.23: 503 while starting, and nothing while the engine is hung."""
        if not self.ready:
            return Response(status_code=503)
        await self.engine.until_unhung()
        if self.engine.role != "unified":
            return Response(status_code=200)
        try:
            probe = self.engine.new_request([1], 1)
        except InjectedError:
            return Response(status_code=503)
        probe.log_metrics = False  # as SGLang's: in no counter (it is no client's)
        self.engine.submit(probe)
        await finished(self.engine, probe)
        return Response(status_code=200)

    async def model_info(self, _request: HttpRequest) -> Response:
        path = str(self.config.model_path)
        return JSONResponse(
            {
                "model_path": path,
                "served_model_name": self.config.served_model_name,
                "tokenizer_path": path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "disaggregation_mode": self.config.disaggregation_mode,
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
            }
        )

    async def server_info(self, _request: HttpRequest) -> Response:
        """The flags flat; at the top level the version, the KV pool and the KV events'
        publisher; `internal_states` the flags again with memory and throughput (no
        capacity there, as on SGLang 0.5.23)."""
        info = self.config.server_info()
        graph = dict.fromkeys(("prefill", "decode", "target_verify", "draft_prefill",
                               "draft_decode", "draft_extend"), 0.0)  # fmt: skip
        memory = {"weight": 0.0, "kvcache": 0.0, "startup_available": 0.0, "graph": graph,
                  "token_capacity": self.engine.cost.max_total_tokens,
                  "token_capacity_swa": None}  # fmt: skip
        state = {**info, "memory_usage": memory,
                 "last_gen_throughput": self.engine.stats.gen_throughput}  # fmt: skip
        info.update(version=VERSION, max_total_num_tokens=self.engine.cost.max_total_tokens,
                    max_req_input_len=self.config.context_length - 6,
                    kv_events=self._kv_events_info(), internal_states=[state])  # fmt: skip
        return JSONResponse(info)

    def _kv_events_info(self) -> dict[str, object] | None:
        events = self.config.kv_events_config
        if events is None:
            return None
        host, _, port = events.endpoint.rpartition(":")
        return {"publisher": events.publisher, "endpoint_host": host.rpartition("//")[2],
                "endpoint_port_base": int(port) if port.isdigit() else None,
                "topic": events.topic, "block_size": self.config.page_size,
                "dp_size": self.config.dp_size}  # fmt: skip

    async def load(self, _request: HttpRequest) -> Response:
        """SGLang's `/v1/loads`: asked of the scheduler, so a hung engine does not answer."""
        await self.engine.until_unhung()
        return JSONResponse(
            {
                "timestamp": datetime.datetime.now(datetime.UTC).isoformat(),
                "version": VERSION,
                "accelerator": None,
                "num_accelerators": 1,
                "loads": [self.metrics.load(self.config.role)],
            }
        )

    def _model_card(self) -> dict[str, object]:
        c = self.config
        return {"id": c.served_model_name, "object": "model", "created": int(self.started),
                "owned_by": "sglang", "root": c.served_model_name, "parent": None,
                "max_model_len": c.context_length}  # fmt: skip

    async def models(self, _request: HttpRequest) -> Response:
        cards = self.loras.cards(self.config.served_model_name, int(self.started))
        return JSONResponse({"object": "list", "data": [self._model_card(), *cards]})

    async def lora_loads(self, _request: HttpRequest) -> Response:
        """The simulator's own: the loads it has done (each one's time spent, whoever asked:
        the run-time API, or a request naming one it had unloaded), and what it holds."""
        return JSONResponse({"loads": self.loras.loads, "loaded": list(self.loras.loaded)})

    async def load_lora_adapter(self, request: HttpRequest) -> Response:
        body = await parse(request, _LoadLora)
        status, answer = await self.loras.load(body.lora_name, body.lora_path, body.pinned)
        return JSONResponse(answer, status_code=status)

    async def unload_lora_adapter(self, request: HttpRequest) -> Response:
        body = await parse(request, _UnloadLora)
        status, answer = await self.loras.unload(body.lora_name)
        return JSONResponse(answer, status_code=status)

    async def model(self, request: HttpRequest) -> Response:
        name = request.path_params["model"]
        if name != self.config.served_model_name:
            error = {"message": f"The model '{name}' does not exist", "param": "model",
                     "type": "invalid_request_error", "code": "model_not_found"}  # fmt: skip
            return JSONResponse({"error": error}, status_code=404)
        return JSONResponse(self._model_card())

    async def flush_cache(self, _request: HttpRequest) -> Response:
        try:
            self.engine.flush()
        except EngineBusy:
            return PlainTextResponse("Flush cache failed.\n", status_code=400)
        return PlainTextResponse(
            "Cache flushed.\nPlease check backend logs for more details. (When there are "
            "running or waiting requests, the operation will not be performed.)\n"
        )

    async def abort_request(self, request: HttpRequest) -> Response:
        body = await parse(request, _Abort)
        if body.abort_all or body.rid:
            self.engine.abort_soon(None if body.abort_all else body.rid)
        return Response(status_code=200)

    async def prometheus(self, _request: HttpRequest) -> Response:
        if not self.config.enable_metrics:
            return PlainTextResponse(
                "metrics are off: start with --enable-metrics", status_code=404
            )
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def faults(self, request: HttpRequest) -> Response:
        if request.method == "POST":
            change = await parse(request, FaultChange)
            if change.crash:
                asyncio.get_running_loop().call_later(0.05, crash)
            faults = self.engine.faults
            if change.slow_factor is not None:
                faults.slow_factor = change.slow_factor
            if change.error_rate is not None:
                faults.error_rate = change.error_rate
            if change.hang is not None:
                self.engine.set_hang(change.hang)
            if "poison" in change.model_fields_set:
                faults.poison = change.poison
            if change.output is not None:
                faults.output = change.output
            if change.logprob_shift is not None:
                faults.logprob_shift = change.logprob_shift
        f = self.engine.faults
        return JSONResponse({"slow_factor": f.slow_factor, "error_rate": f.error_rate,
                             "hang": f.hang, "poison": f.poison, "output": f.output,
                             "logprob_shift": f.logprob_shift})  # fmt: skip


class _Abort(BaseModel):
    model_config = ConfigDict(extra="allow")
    rid: str | None = None
    abort_all: bool = False


async def _not_found(_request: HttpRequest, _error: Exception) -> Response:
    return JSONResponse({"detail": "Not Found"}, status_code=404)  # as SGLang's FastAPI


def crash() -> None:
    """The crash fault: die at once, as a segfaulting engine does, without cleanup."""
    log.error("simulator crashing on purpose")
    os._exit(CRASH_EXIT_CODE)


def bootstrap_app(kv: Kv) -> Starlette:
    """A prefill server's bootstrap port: decode servers fetch a room's KV cache here."""

    async def fetch(request: HttpRequest) -> Response:
        room = int(request.path_params["room"])
        timeout_s = min(60.0, float(request.query_params.get("timeout_s", "30")))
        tokens = await kv.take(room, timeout_s)
        if tokens is None:
            return JSONResponse(
                {"message": f"room {room} was never prefilled here"}, status_code=404
            )
        return JSONResponse({"room": room, "tokens": tokens})

    return Starlette(routes=[Route("/kv/{room:int}", fetch)])
