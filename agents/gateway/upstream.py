"""The gateway's HTTP/1.1 client to its engines: keep-alive connections pooled per engine, each
request written in one send, each answer parsed by httptools and handed on as its bytes come.

It replaces aiohttp's client on the hot path. On the same null engine aiohttp's client took
56 µs of CPU a request and this one 13 (bench/README.md, "The gateway's client"): the engines
are ours, speak HTTP/1.1 on loopback or a private network, and need none of what a general
client carries (cookies, redirects, proxies, TLS, compression, tracing hooks).

A pooled connection that the engine closed while it was idle fails the next request before any
byte of an answer; that request is sent once more on a new connection. Any other failure is the
caller's to handle: `UpstreamError` is a `ConnectionError`.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
import time
from collections import deque
from typing import cast
from urllib.parse import urlsplit

import httptools

IDLE_S = 3.0  # uvicorn (SGLang's server) drops an idle connection after 5 s
MAX_IDLE = 512  # idle connections kept per engine
KEEPALIVE_S = 3  # TCP keepalive: idle seconds before probing, and between probes
UNACKED_MS = 6000  # sent bytes unacknowledged this long: the connection is dead
HIGH_WATER = 1 << 18  # answer bytes buffered before the engine's socket stops being read


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


class UpstreamError(ConnectionError):
    """The engine could not be reached, or its answer broke off."""


class Unreachable(UpstreamError):
    """No connection could be made: the request never reached the engine."""


@functools.lru_cache(maxsize=1024)
def origin(url: str) -> tuple[str, int, bytes, bool]:
    """host, port, the Host header and whether it is TLS, of a base URL (a peer region's
    gateway may be https; engines are http)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s):// URL: {url!r}")
    tls = parts.scheme == "https"
    return parts.hostname, parts.port or (443 if tls else 80), parts.netloc.encode("ascii"), tls


class Answer:
    """An engine's answer: status and headers at once, the body as it comes. Its connection
    is held until `release` (or the end of `with answer:`) gives it back to the pool."""

    def __init__(self, connection: _Connection, url: str) -> None:
        self.url = url  # the engine's base URL
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.got_bytes = False
        self._connection = connection
        loop = asyncio.get_running_loop()
        self._head: asyncio.Future[None] = loop.create_future()
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        self._keep_alive = False
        self._error: UpstreamError | None = None

    def header(self, name: bytes) -> bytes | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)

    async def read(self) -> bytes:
        """The whole body."""
        while not self._done:
            await self._wait()
        return b"".join(self._chunks)

    def chunks(self) -> _Chunks:
        return _Chunks(self)

    def __enter__(self) -> Answer:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()

    def release(self) -> None:
        """Back to the pool if the answer was read to its end and the engine keeps the
        connection; closed otherwise. Once: the connection is then another answer's."""
        connection = self._connection
        if connection.answer is not self:
            return
        connection.answer = None
        if self._done and self._keep_alive and not connection.closed:
            connection.resume()
            connection.pool.put(connection)
        else:
            connection.close()

    def close(self) -> None:
        """Its connection closed, whatever was read."""
        self._done = False
        self.release()

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # the connection's parser reports here
    def head_done(self, status: int) -> None:
        self.status = status
        if not self._head.done():
            self._head.set_result(None)

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > HIGH_WATER:
            self._connection.pause()
        self._wake()

    def complete(self, keep_alive: bool) -> None:
        self._done, self._keep_alive = True, keep_alive
        self._wake()

    def fail(self, error: UpstreamError) -> None:
        if self._done:
            return
        self._error = error
        if not self._head.done():
            self._head.set_exception(error)
        self._wake()


class _Chunks:
    """The body as it comes, every chunk buffered so far at once."""

    def __init__(self, answer: Answer) -> None:
        self._answer = answer

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        answer = self._answer
        while not answer._chunks:
            if answer._done:
                raise StopAsyncIteration
            await answer._wait()
        chunks = answer._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        answer._buffered = 0
        answer._connection.resume()
        return data


class _Connection(asyncio.Protocol):
    def __init__(self, pool: Upstream, key: tuple[str, int, bool]) -> None:
        self.pool, self.key = pool, key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: Answer | None = None
        self.closed = False
        self.paused = False
        self.idle_since = 0.0

    def send(self, url: str, request: bytes) -> Answer:
        assert self.transport is not None
        self.answer = answer = Answer(self, url)
        self.transport.write(request)
        return answer

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None and hasattr(socket, "TCP_KEEPIDLE"):
            # a peer cut off without a word (a partition) is found in seconds, even while a
            # request on the connection waits for its answer
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
            # and one that stops acknowledging what was sent (keepalive does not cover it)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, UNACKED_MS)

    def data_received(self, data: bytes) -> None:
        answer = self.answer
        if answer is None:  # bytes nobody asked for: this connection is not to be trusted
            self.close()
            return
        answer.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            answer.fail(UpstreamError(f"the engine's answer is not HTTP: {error}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.answer is not None:
            self.answer.fail(UpstreamError(f"the engine closed the connection ({exc or 'EOF'})"))

    # httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.answer is not None
        self.answer.headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.answer is not None
        self.answer.head_done(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        assert self.answer is not None
        self.answer.feed(body)

    def on_message_complete(self) -> None:
        assert self.answer is not None
        self.answer.complete(self.parser.should_keep_alive())


class Upstream:
    """The pool: `post` an engine's URL, get its answer once its head is in."""

    def __init__(self, connect_timeout_s: float = 2.0) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[tuple[str, int, bool], list[_Connection]] = {}

    async def post(self, url: str, path: str, body: bytes, headers: bytes = b"") -> Answer:
        """`headers` are whole header lines, each ending in CRLF."""
        host, port, netloc, tls = origin(url)
        request = b"".join((
            b"POST ", path.encode("ascii"), b" HTTP/1.1\r\nHost: ", netloc,
            b"\r\nContent-Length: ", str(len(body)).encode(), b"\r\n", headers, b"\r\n", body,
        ))  # fmt: skip
        while True:
            connection = self._take((host, port, tls))
            reused = connection is not None
            if connection is None:
                connection = await self._connect((host, port, tls))
            answer = connection.send(url, request)
            try:
                await answer._head
            except UpstreamError:
                connection.close()
                if reused and not answer.got_bytes:
                    continue  # the engine had closed it while it was idle
                raise
            except BaseException:
                connection.close()
                raise
            return answer

    def put(self, connection: _Connection) -> None:
        idle = self._idle.setdefault(connection.key, [])
        if len(idle) >= MAX_IDLE:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        idle.append(connection)

    async def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()

    def _take(self, key: tuple[str, int, bool]) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        oldest = time.monotonic() - IDLE_S
        while idle:
            connection = idle.pop()
            if not connection.closed and connection.idle_since > oldest:
                return connection
            connection.close()
        return None

    async def _connect(self, key: tuple[str, int, bool]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self, key),
                    key[0],
                    key[1],
                    ssl=_tls_context() if key[2] else None,
                )
        except (OSError, TimeoutError) as error:
            raise Unreachable(f"cannot connect to {key[0]}:{key[1]}: {error}") from None
        return connection
