"""The gateway's client to its engines, against real sockets: an engine written byte by byte
here, so that each way an engine's connection can go wrong is made to happen."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from agents.gateway.upstream import Upstream, UpstreamError

pytestmark = pytest.mark.asyncio
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _request(reader: asyncio.StreamReader) -> bytes:
    """One request's body (the client always sends Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return await reader.readexactly(length)


def _answer(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


class Engine:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _engine(handler: Handler) -> AsyncIterator[Engine]:
    engine = Engine(handler)
    server = await asyncio.start_server(engine._serve, "127.0.0.1", 0)
    engine.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        yield engine


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    client = Upstream(connect_timeout_s=1.0)
    yield client
    await client.close()


async def test_connections_are_kept_and_reused(upstream: Upstream) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await _request(reader)
            writer.write(_answer(body.upper(), b"Content-Type: application/json\r\n"))

    async for engine in _engine(echo):
        for text in (b"one", b"two", b"three"):
            answer = await upstream.post(engine.url, "/generate", text)
            assert (answer.status, await answer.read()) == (200, text.upper())
            assert answer.header(b"content-type") == b"application/json"
            answer.release()
        assert engine.connections == 1


async def test_a_connection_the_engine_dropped_while_idle_is_replaced_unseen(
    upstream: Upstream,
) -> None:
    """The engine answers once, then closes the connection on the next request without a
    byte, as a server whose keep-alive ran out does at the moment the request arrives."""

    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_answer(await _request(reader)))
        await writer.drain()
        await reader.read(1)  # the next request: dropped

    async for engine in _engine(once):
        for text in (b"a", b"b", b"c"):
            answer = await upstream.post(engine.url, "/generate", text)
            assert await answer.read() == text
            answer.release()
        assert engine.connections == 3


async def test_an_answer_cut_short_is_an_error_not_a_short_body(upstream: Upstream) -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        await writer.drain()

    async for engine in _engine(cut):
        answer = await upstream.post(engine.url, "/generate", b"{}")
        with pytest.raises(UpstreamError):
            await answer.read()
        answer.release()


async def test_an_engine_that_is_not_there_fails_at_once(upstream: Upstream) -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(UpstreamError, match="cannot connect"):
        await upstream.post(f"http://127.0.0.1:{port}", "/generate", b"{}")


async def test_a_big_stream_read_slowly_arrives_whole_and_the_connection_serves_again(
    upstream: Upstream,
) -> None:
    """Past the buffer's high-water mark the engine's socket stops being read; every byte still
    arrives, in order, and the connection goes back to the pool able to read."""
    chunk = bytes(range(256)) * 256  # 64 KiB

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(64):
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        body = await _request(reader)
        writer.write(_answer(body))
        await writer.drain()

    async for engine in _engine(stream):
        answer = await upstream.post(engine.url, "/generate", b"{}")
        received = bytearray()
        async with asyncio.timeout(20):  # a socket never read again would hang here
            async for data in answer.chunks():
                received += data
                await asyncio.sleep(0.002)
        assert bytes(received) == chunk * 64
        answer.release()
        again = await upstream.post(engine.url, "/generate", b"again")
        assert await again.read() == b"again"
        again.release()
        assert engine.connections == 1
