"""The byte relay between an engine and the client. A stream passes through as the engine wrote
it, cut only at event boundaries; the gateway reads just the event that carries the usage,
found by a substring search, and drops it when the client did not ask for it."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from agents.gateway.errors import GatewayError
from agents.gateway.limits import LIMITS

USAGE = b'"usage"'
HOP_HEADERS = {b"content-length", b"transfer-encoding", b"connection", b"keep-alive", b"date",
               b"server"}  # fmt: skip
EVENT_END = b"\n\n"
FIRST_AT = web.ResponseKey("meridian.first_at", float)  # a streamed response's first event
JSON_REQUEST = b"Content-Type: application/json\r\nX-Request-ID: "


@dataclass
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None


class StreamMeter:
    """Event-aligns a stream's chunks and takes its usage on the way."""

    def __init__(self, native: bool, keep_usage: bool) -> None:
        self.native, self.keep_usage = native, keep_usage
        self.usage = Usage()
        self._partial = b""
        self._last = b""  # the last whole event seen (native streams carry usage in each)

    def feed(self, chunk: bytes) -> bytes:
        """The whole events in what came so far, as they are; a partial one waits."""
        if self._partial:
            chunk, self._partial = self._partial + chunk, b""
        end = chunk.rfind(EVENT_END)
        if end < 0:
            self._partial = chunk
            return b""
        end += len(EVENT_END)
        if end < len(chunk):
            chunk, self._partial = chunk[:end], chunk[end:]
        if self.native:
            self._last = chunk
        elif USAGE in chunk:
            chunk = self._take_usage(chunk)
        return chunk

    def rest(self) -> bytes:
        """What is left at the end (a stream that did not end with a blank line)."""
        rest, self._partial = self._partial, b""
        return rest

    def finish(self) -> Usage:
        if self.native and self._last:
            events = [e for e in self._last.split(EVENT_END) if e.startswith(b"data: {")]
            if events:
                meta = _loads(events[-1][6:]).get("meta_info") or {}
                self.usage = Usage(
                    meta.get("prompt_tokens"), meta.get("completion_tokens"),
                    meta.get("cached_tokens"),
                )  # fmt: skip
        return self.usage

    def _take_usage(self, chunk: bytes) -> bytes:
        kept: list[bytes] = []
        for event in chunk.split(EVENT_END)[:-1]:
            if USAGE in event and event.startswith(b"data: {"):
                doc = _loads(event[6:])
                usage = doc.get("usage")
                if isinstance(usage, dict):
                    self.usage = usage_of(usage)
                    if not self.keep_usage and doc.get("choices") == []:
                        continue  # the chunk the gateway asked for, not the client
            kept.append(event + EVENT_END)
        return b"".join(kept)


def usage_of(usage: dict[str, Any]) -> Usage:
    details = usage.get("prompt_tokens_details") or {}
    return Usage(
        usage.get("prompt_tokens"),
        usage.get("completion_tokens"),
        details.get("cached_tokens") if isinstance(details, dict) else None,
    )


def body_usage(body: bytes, native: bool) -> Usage:
    """The usage of a whole (non-streamed) answer."""
    doc = _loads(body)
    if native:
        if isinstance(doc, list):  # a batch: the first one's
            doc = doc[0] if doc else {}
        meta = doc.get("meta_info") or {}
        return Usage(
            meta.get("prompt_tokens"), meta.get("completion_tokens"), meta.get("cached_tokens")
        )
    usage = doc.get("usage")
    return usage_of(usage) if isinstance(usage, dict) else Usage()


def engine_message(body: bytes) -> str:
    """What an engine's error answer says: SGLang's `message`, or OpenAI's `error.message`."""
    doc = _loads(body)
    if isinstance(doc, dict):
        error = doc.get("error")
        message = error.get("message") if isinstance(error, dict) else doc.get("message")
        if isinstance(message, str):
            return message
    return "no reason given"


def _loads(data: bytes) -> Any:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict | list) else {}


@dataclass(frozen=True, slots=True)
class Answered:
    """The answer the client got (or, streamed, is getting whole)."""

    response: web.StreamResponse
    usage: Usage


@dataclass(frozen=True, slots=True)
class Retry:
    """The worker failed before the client saw a byte: the plan goes on without it. `broke`:
    the engine broke off (its connection closed or reset) with the request in hand, while it
    had been serving others: the request itself may be what broke it."""

    worker_id: str
    why: str
    broke: bool = False

    def __str__(self) -> str:
        return f"{self.worker_id}: {self.why}"


@dataclass(frozen=True, slots=True)
class Cut:
    """An answer's stream broke after part of it reached the client: it is carried on
    elsewhere (agents/gateway/migration.py), or ends with an error event."""

    by: str
    why: str


@dataclass(frozen=True, slots=True)
class Broken:
    """A fault of ours after a stream's head went out: the stream ended with an error event
    (`response`); `cause` is the fault."""

    response: web.StreamResponse
    cause: BaseException


@dataclass(frozen=True, slots=True)
class Refused:
    """The engine refused the request (4xx): its reason is the client's answer."""

    error: GatewayError


@dataclass(frozen=True, slots=True)
class Yielded:
    """It gave its engine's room to a higher class's request before its client saw a byte of
    it: it waits for admission again (agents/router/classes.py)."""

    worker_id: str


# how one worker's (or peer's) go ended
Outcome = Answered | Retry | Cut | Broken | Refused | Yielded


@dataclass(frozen=True, slots=True)
class ClientGone:
    """The client closed its connection, or stopped reading (`stalled`)."""

    why: str
    stalled: bool = False


async def to_client(
    write: Awaitable[object], request: web.Request | None = None
) -> ClientGone | None:
    """A write to the client; given its `request`, bounded when the client has fallen
    behind (its socket's send buffer holds bytes already): a client that reads nothing for
    `client_stall_s` is taken to be gone, so that it holds no slot as long as it likes. A
    client that keeps up costs one look at the buffer."""
    transport = request.transport if request is not None else None
    try:
        if transport is None or not transport.get_write_buffer_size():
            await write
            return None
        bound = request.app[LIMITS].client_stall_s  # type: ignore[union-attr]
        async with asyncio.timeout(bound):
            await write
    except ConnectionResetError as error:  # aiohttp's ClientConnectionResetError is one
        return ClientGone(str(error))
    except TimeoutError:
        return ClientGone(f"the client read nothing for {bound:g} s", stalled=True)
    return None


def stream_error(message: str, code: str = "upstream_failed") -> bytes:
    error = {"error": {"message": message, "type": "api_error", "code": code}}
    return b"data: " + orjson.dumps(error) + b"\n\ndata: [DONE]\n\n"


async def write_quietly(response: web.StreamResponse, data: bytes, eof: bool = True) -> None:
    try:
        if data:
            await response.write(data)
        if eof:
            await response.write_eof()
    except ConnectionResetError:
        pass


def upstream_headers(request_id: str) -> bytes:
    """The header lines of a call to an engine. The id came in a header the server parsed (no
    CR or LF), or was made here."""
    return JSON_REQUEST + request_id.encode("utf-8", "surrogateescape") + b"\r\n"


def relayed_headers(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """An engine's headers that pass on to the client: all but the connection's own."""
    return {
        k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k.lower() not in HOP_HEADERS
    }


def new_id() -> str:
    """A request id for a request that came without one."""
    return os.urandom(16).hex()


def server_timing(since: float) -> str:
    """This gateway's time on the request so far (monotonic `since`), for a peer region."""
    return f"gw;dur={(time.monotonic() - since) * 1000:.1f}"
