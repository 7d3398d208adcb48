"""The floor under an agent stream's memory: a bare grpcio aio server, with the control plane's
server options, holding as many open bidirectional streams as the control plane holds agents.
Each stream is sent one message of a snapshot's size and acknowledged once, as an agent's is;
nothing else runs in that server. Its resident memory with the streams open, less before,
is what gRPC itself takes per stream, side by side with the control plane's.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import AsyncIterator
from multiprocessing.connection import Connection
from typing import Any

import grpc

from bench.procfs import rss_mb
from controlplane.push.server import SERVER_OPTIONS
from meridian.procs import free_port

METHOD = "/bench.Floor/Sync"
FIRST = 2_048  # bytes: about a node's snapshot in a region of 500 nodes, as a delta is less
OPEN_TIMEOUT_S = 600.0


async def _serve(port: int, ready: Connection) -> None:
    async def sync(requests: AsyncIterator[bytes], _: Any) -> AsyncIterator[bytes]:
        yield b"s" * FIRST
        async for _request in requests:
            yield b"ack"

    handler = grpc.method_handlers_generic_handler(
        "bench.Floor", {"Sync": grpc.stream_stream_rpc_method_handler(sync)}
    )
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    ready.send("ready")
    await server.wait_for_termination()


def serve(port: int, ready: Connection) -> None:
    asyncio.run(_serve(port, ready))


async def _open(port: int, count: int, done: Connection) -> None:
    channels: list[grpc.aio.Channel] = []
    calls: list[grpc.aio.StreamStreamCall[bytes, bytes]] = []
    for _ in range(count):  # one channel each: one connection each, as agents have
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        call: grpc.aio.StreamStreamCall[bytes, bytes] = channel.stream_stream(METHOD)()
        await call.read()
        await call.write(b"a" * 64)
        await call.read()
        channels.append(channel)
        calls.append(call)
    done.send("open")
    await asyncio.sleep(3600)  # held until the measuring process ends this one


def open_streams(port: int, count: int, done: Connection) -> None:
    asyncio.run(_open(port, count, done))


def measure(count: int) -> dict[str, float]:
    """The bare server's memory before and with `count` open streams (MB), and per stream (KB)."""
    context = multiprocessing.get_context("spawn")
    port = free_port()
    theirs, ours = context.Pipe()
    server = context.Process(target=serve, args=(port, theirs), daemon=True)
    server.start()
    clients = None
    try:
        if not ours.poll(60):
            raise RuntimeError("the bare gRPC server did not start")
        ours.recv()
        before = rss_mb(server.pid or 0)[0]
        clients = context.Process(target=open_streams, args=(port, count, theirs), daemon=True)
        clients.start()
        if not ours.poll(OPEN_TIMEOUT_S):
            raise RuntimeError(f"{count} streams were not open in {OPEN_TIMEOUT_S:.0f} s")
        ours.recv()
        after = rss_mb(server.pid or 0)[0]
    finally:
        for process in (clients, server):
            if process is not None:
                process.kill()
                process.join()
    return {
        "bare_rss_mb": round(before, 1),
        "bare_rss_streams_mb": round(after, 1),
        "bare_kb_per_stream": round((after - before) * 1024 / count, 1),
    }
