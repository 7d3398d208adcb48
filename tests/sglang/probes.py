"""One probe set, sent alike to the real SGLang and to the simulator: each answer reduced to
its shape (status, JSON keys and value types, SSE frames, KV event records, metric families
and their labels), so that the two can be compared key by key."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import msgpack
import zmq
import zmq.asyncio
from prometheus_client.parser import text_string_to_metric_families

from agents.engines import contract

Shape = Any
JSON = {"content-type": "application/json"}


def shape(value: Any) -> Shape:
    """A JSON value's structure: keys kept, values replaced by their type; a list by the
    shape of its first item."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "str"
    return "null"


def differences(real: Shape, sim: Shape, path: str = "") -> list[str]:
    """Where the simulator's shape departs from the real one's, one line each. An SSE
    stream's frames are compared frame by frame, in order."""
    if path.endswith(".frames") and isinstance(real, list) and isinstance(sim, list):
        out = (
            []
            if len(real) == len(sim)
            else [f"{path}: real {len(real)} kinds of frame in turn, simulator {len(sim)}"]
        )
        for n, (one, other) in enumerate(zip(real, sim, strict=False)):
            out += differences(one, other, f"{path}[{n}]")
        return out
    if isinstance(real, dict) and isinstance(sim, dict):
        out = [f"{path}.{k}: only the real server has it" for k in real if k not in sim]
        out += [f"{path}.{k}: only the simulator has it" for k in sim if k not in real]
        for k in real:
            if k in sim:
                out += differences(real[k], sim[k], f"{path}.{k}")
        return out
    if isinstance(real, list) and isinstance(sim, list):
        if real and sim:
            return differences(real[0], sim[0], f"{path}[]")
        return []  # an empty list says nothing of its items
    if real != sim:
        return [f"{path}: real {_kind(real)}, simulator {_kind(sim)}"]
    return []


def merged(one: Shape, other: Shape) -> Shape:
    """Two records' shapes as one: a field null in one and set in the other is set (a first
    block's parent hash is null, the next one's a number; which arrives first is chance)."""
    if one is None or one == "null":
        return other if other is not None else one
    if isinstance(one, dict) and isinstance(other, dict):
        return {k: merged(one.get(k), other.get(k)) for k in one | other}
    return one


def _kind(value: Shape) -> str:
    return type(value).__name__ if isinstance(value, dict | list) else str(value)


# What is read of /server_info (by Meridian's poller and by sglang-router): the rest of its
# 550 keys are SGLang's own settings, which the simulator has no use for
SERVER_INFO_READ = ("version", "max_total_num_tokens", "max_req_input_len", "kv_events",
                    "kv_events_config", "page_size", "tokenizer_path", "model_path",
                    "served_model_name", "tp_size", "dp_size", "disaggregation_mode",
                    "context_length", "internal_states")  # fmt: skip
INTERNAL_STATE_READ = ("last_gen_throughput", "memory_usage")
MODEL_INFO_READ = ("model_path", "tokenizer_path", "served_model_name", "is_generation",
                   "preferred_sampling_params", "weight_version", "model_type", "architectures",
                   "disaggregation_mode")  # fmt: skip


def _answer(response: httpx.Response, read: tuple[str, ...] = ()) -> dict[str, Any]:
    """Its status and body's shape; with `read`, only those keys of the body."""
    try:
        document = response.json() if response.content else "empty"
    except ValueError:
        document = "text"
    if read and isinstance(document, dict):
        document = {k: v for k, v in document.items() if k in read}
        states = document.get("internal_states")
        if isinstance(states, list):
            document["internal_states"] = [
                {k: v for k, v in state.items() if k in INTERNAL_STATE_READ} for state in states
            ]
    body = document if isinstance(document, str) else shape(document)
    return {"status": response.status_code, "body": body}


def frames(text: str) -> Shape:
    """An SSE stream's frames as shapes, runs of one shape counted once."""
    out: list[Shape] = []
    for line in text.splitlines():
        if not line.startswith("data: "):
            continue
        data = line.removeprefix("data: ")
        one = "[DONE]" if data == "[DONE]" else shape(json.loads(data))
        if not out or out[-1] != one:
            out.append(one)
    return out


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hello, how are you?"}],
        "max_tokens": 8, "temperature": 0, "ignore_eos": True}  # fmt: skip
COMPLETION = {"model": "tiny", "prompt": "The quick brown fox jumps over the lazy dog.",
              "max_tokens": 8, "temperature": 0, "ignore_eos": True}  # fmt: skip
BATCH = {
    **COMPLETION,
    "prompt": ["The quick brown fox", "jumps over the lazy dog"],
    "rid": "batch-probe",
}  # a batch of prompts: a request each in the engine
GENERATE = {
    "text": "The quick brown fox jumps over the lazy dog.",
    "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
}
LONG = {"text": "a long one", "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}
USAGE = {"stream": True, "stream_options": {"include_usage": True}}
# the usage so far in every event: how the gateway gathers a whole answer (agents/gateway/gather.py)
EACH = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


async def http_probes(http: httpx.AsyncClient) -> dict[str, Any]:
    """Every endpoint the agent, the router and sglang-router use, and their errors."""
    out: dict[str, Any] = {}
    # once before the probes, so that the prompt probed is partly cached on both (SGLang's
    # `cached_tokens_details` is null with nothing cached) and both have decoded
    assert (await http.post("/generate", json=GENERATE)).status_code == 200
    gets = {"ready": "/ready", "model_info": "/model_info", "server_info": "/server_info",
            "loads": "/v1/loads", "models": "/v1/models", "model_unknown": "/v1/models/nope",
            "get_load (gone)": "/get_load", "unknown path": "/no_such_route"}  # fmt: skip
    reads = {"server_info": SERVER_INFO_READ, "model_info": MODEL_INFO_READ}
    for name, path in gets.items():
        out[name] = _answer(await http.get(path), reads.get(name, ()))
    # what the agent reads of it: the KV pool, and the slots service classes reserve a share of
    read = contract.read_loads((await http.get("/v1/loads")).json())
    out["loads, as the agent reads them"] = {
        "max_total_tokens known": read.max_total_tokens > 0,
        "max_running known": read.max_running > 0,
    }
    out["health"] = _answer(await http.get("/health", timeout=60))
    posts: dict[str, tuple[str, Any]] = {
        "generate": ("/generate", GENERATE),
        "generate: max_new_tokens -1": (
            "/generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}}),
        "generate: no input": ("/generate", {"sampling_params": {"max_new_tokens": 1}}),
        "chat": ("/v1/chat/completions", CHAT),
        "chat: unknown model": ("/v1/chat/completions", {**CHAT, "model": "nope"}),
        "chat: no messages": ("/v1/chat/completions", {"model": "tiny"}),
        "completions": ("/v1/completions", COMPLETION),
        "completions: a batch": ("/v1/completions", BATCH),
    }  # fmt: skip
    for name, (path, body) in posts.items():
        out[name] = _answer(await http.post(path, json=body))
    bad = await http.post("/v1/chat/completions", content=b"{nope", headers=JSON)
    out["chat: bad JSON"] = _answer(bad)
    streams = {"generate stream": ("/generate", {**GENERATE, "stream": True}),
               "chat stream": ("/v1/chat/completions", {**CHAT, **USAGE}),
               "completions stream": ("/v1/completions", {**COMPLETION, **USAGE}),
               "completions batch stream": ("/v1/completions", {**BATCH, **USAGE}),
               "chat stream, usage in each": ("/v1/chat/completions", {**CHAT, **EACH}),
               "completions stream, usage in each": ("/v1/completions",
                                                     {**COMPLETION, **EACH})}  # fmt: skip
    for name, (path, body) in streams.items():
        answer = await http.post(path, json=body)
        out[name] = {"status": answer.status_code, "frames": frames(answer.text)}
    out["prompt tokens"] = await _prompt_tokens(http)
    out.update(await _busy(http))
    await _idle(http)  # the aborted request's answer may come before its engine lets it go
    out["flush idle"] = {"status": (await http.post("/flush_cache")).status_code}
    return out


async def _idle(http: httpx.AsyncClient) -> None:
    """Until the engine says it runs and queues nothing."""
    for _ in range(200):
        (rank,) = (await http.get("/v1/loads")).json()["loads"]
        if rank["num_running_reqs"] == 0 and rank["num_waiting_reqs"] == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the engine never went idle")


async def _prompt_tokens(http: httpx.AsyncClient) -> dict[str, Any]:
    """The same prompts counted: the simulator, given the model's directory, tokenizes and
    renders the chat template as SGLang does."""
    chat = (await http.post("/v1/chat/completions", json=CHAT)).json()
    completion = (await http.post("/v1/completions", json=COMPLETION)).json()
    generated = (await http.post("/generate", json=GENERATE)).json()
    return {"chat": chat["usage"]["prompt_tokens"],
            "completions": completion["usage"]["prompt_tokens"],
            "generate": generated["meta_info"]["prompt_tokens"]}  # fmt: skip


async def _busy(http: httpx.AsyncClient) -> dict[str, Any]:
    """While a long request runs: the load counts it, a flush is refused; then it is aborted
    by its rid and ends as SGLang ends an aborted request."""
    running = asyncio.create_task(http.post("/generate", json={**LONG, "rid": "long-1"}))
    loads: Shape = None
    for _ in range(200):
        answer = (await http.get("/v1/loads")).json()
        if answer["loads"][0]["num_running_reqs"] > 0:
            loads = answer["loads"][0]["num_running_reqs"]
            break
        await asyncio.sleep(0.05)
    flush = await http.post("/flush_cache")
    abort = await http.post("/abort_request", json={"rid": "long-1"})
    aborted = await running
    reason = aborted.json()["meta_info"]["finish_reason"]
    return {
        "loads while busy": {"running": loads},
        "flush busy": {"status": flush.status_code, "text": flush.text},
        "abort": {"status": abort.status_code},
        "aborted generate": {
            "status": aborted.status_code,
            "reason": shape(reason),
            "type": reason["type"],
            "message": reason["message"],
        },
    }


ORCHESTRATOR_FAMILIES = (
    "prompt_tokens", "generation_tokens", "cached_tokens", "num_requests",
    "num_aborted_requests", "time_to_first_token_seconds", "inter_token_latency_seconds",
    "e2e_request_latency_seconds", "queue_time_seconds", "request_time_per_output_token_seconds",
    "num_running_reqs", "num_queue_reqs", "num_used_tokens", "token_usage", "gen_throughput",
    "cache_hit_rate", "max_total_num_tokens", "utilization", "kv_used_tokens",
    "kv_available_tokens",
)  # fmt: skip


def metric_families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """`sglang:` families by name (without the prefix): their type and label names."""
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("sglang:"):
            continue
        labels: set[str] = set()
        for sample in family.samples:
            labels |= set(sample.labels) - {"le", "quantile"}
        out[family.name.removeprefix("sglang:")] = (family.type, frozenset(labels))
    return out


async def kv_event_probe(
    http: httpx.AsyncClient, endpoint: str, context: zmq.asyncio.Context
) -> dict[str, Any]:
    """Subscribe, make the engine store, evict nothing, then clear: each event type's record
    shape, and the frames' own."""
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    socket.connect(endpoint)
    seen: dict[str, Shape] = {}
    frame: Shape = None
    try:
        for _ in range(100):  # ZMQ's slow joiner: until something comes through
            await _store(http)
            if await socket.poll(300):
                break
        await _store(http)
        await _store(http, salt="tenant-a")  # a store under a cache namespace says which
        await _flushed(http)
        while await socket.poll(1500):
            topic, seq, payload = await socket.recv_multipart()
            ts, events, rank = msgpack.unpackb(payload)
            frame = [shape(topic.decode()), len(seq), shape(ts), shape(rank)]
            for event in events:
                kind = str(event.get("type"))
                seen[kind] = merged(seen.get(kind), shape(event))
    finally:
        socket.close(linger=0)
    return {"frame": frame, "events": seen}


async def _store(http: httpx.AsyncClient, salt: str | None = None) -> int:
    """A generation whose prompt and answer the engine's cache stores (under `salt`): the
    prompt tokens it found cached."""
    body: dict[str, Any] = {"input_ids": list(range(20, 60)),
                            "sampling_params": {"max_new_tokens": 4}}  # fmt: skip
    if salt is not None:
        body["cache_salt"] = salt
    answer = await http.post("/generate", json=body)
    assert answer.status_code == 200, answer.text
    return int(answer.json()["meta_info"]["cached_tokens"])


async def cache_salt_probe(http: httpx.AsyncClient) -> list[bool]:
    """One prompt sent in turn under salt a, a again, b, none, and b again, from an empty
    cache: whether each found any of it cached (a prefix is cached per salt)."""
    await _flushed(http)
    return [await _store(http, salt) > 0 for salt in ("a", "a", "b", None, "b")]


SLOTS = 4  # --max-running-requests of both engines: the priority probe fills them


async def priority_probe(http: httpx.AsyncClient) -> dict[str, Any]:
    """With every slot taken by long requests of priority 0, three short ones arrive: of
    priority 0, of none (the engine's default, 20, as Meridian starts it) and of 30, in that
    order. Which finished last, and whether the other two finished before any long one (they
    preempted)."""
    await _idle(http)
    done: list[str] = []

    async def one(name: str, priority: int | None, tokens: int) -> None:
        body: dict[str, Any] = {
            "text": f"priority {name}",
            "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True},
        }
        if priority is not None:
            body["priority"] = priority
        answer = await http.post("/generate", json=body)
        assert answer.status_code == 200, answer.text
        done.append(name)

    calls = [asyncio.create_task(one(f"long {i}", 0, 400)) for i in range(SLOTS)]
    for _ in range(400):
        if (await http.get("/v1/loads")).json()["loads"][0]["num_running_reqs"] >= SLOTS:
            break
        await asyncio.sleep(0.02)
    for name, priority in (("low", 0), ("default", None), ("high", 30)):
        calls.append(asyncio.create_task(one(name, priority, 8)))
        await asyncio.sleep(0.05)
    await asyncio.gather(*calls)
    first_long = min(done.index(f"long {i}") for i in range(SLOTS))
    return {"last short": [n for n in done if not n.startswith("long")][-1],
            "high before every long one": done.index("high") < first_long,
            "default before every long one": done.index("default") < first_long}  # fmt: skip


async def _flushed(http: httpx.AsyncClient) -> None:
    for _ in range(100):
        if (await http.post("/flush_cache")).status_code == 200:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the engine never flushed its cache")


async def startup_states(
    url: str, process: asyncio.subprocess.Process, within_s: float
) -> list[str]:
    """`/ready` from launch to ready: `closed` while the port refuses, then each status, runs
    counted once."""
    states: list[str] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    async with httpx.AsyncClient(timeout=2) as http:
        while loop.time() < deadline and process.returncode is None:
            try:
                state = str((await http.get(f"{url}/ready")).status_code)
            except httpx.TransportError:
                state = "closed"
            if not states or states[-1] != state:
                states.append(state)
            if state == "200":
                return states
            await asyncio.sleep(0.05)
    raise AssertionError(f"not ready within {within_s} s: {states}")
