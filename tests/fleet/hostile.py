"""What hostile tests share: one two-region fleet for a whole module (us-east escalates to
us-west), raw HTTP/1.1 over a socket for what no client library would send, and the invariant
that matters after any of it: nothing held anywhere, and a normal request served."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
import pytest_asyncio

from controlplane.db.embedded import Credentials
from tests.kits.fleet import LLAMA, Fleet, fleet_of
from tests.kits.push import eventually
from tests.kits.services import TEMPLATE, scratch_database

HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
REGIONS = ("us-east", "us-west")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def fleet(postgres: Credentials, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[
    Fleet
]:  # fmt: skip
    """us-east and us-west, their agents with short header and body timeouts."""
    env = {
        "MERIDIAN_AGENT_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "MERIDIAN_AGENT_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
    }
    data: Path = tmp_path_factory.mktemp("hostile")
    async with (
        scratch_database(postgres, "hostile", TEMPLATE) as url,
        fleet_of(url, data, REGIONS, agent_env=env) as fleet,
    ):
        yield fleet


@dataclass
class Raw:
    """An answer read off the socket: None for a connection closed before any answer."""

    status: int | None
    headers: dict[str, str]
    body: bytes
    seconds: float  # from the connect to the answer or the close

    def json(self) -> Any:
        return orjson.loads(self.body)


async def raw(url: str, *parts: bytes, pause_s: float = 0.0, within_s: float = 15.0) -> Raw:
    """`parts` written in turn, `pause_s` apart, on one new connection; then what comes back
    until the server closes, or the answer is whole (by its Content-Length)."""
    where = urlsplit(url)
    started = time.monotonic()  # before the connect: the server's clocks start at its accept
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    data = b""
    try:
        async with asyncio.timeout(within_s):
            for part in parts:
                if reader.at_eof():
                    break
                writer.write(part)
                try:
                    await writer.drain()
                except ConnectionError:
                    break
                if pause_s:
                    await asyncio.sleep(pause_s)
            while not reader.at_eof() and not _whole(data):
                try:
                    chunk = await reader.read(65536)
                except ConnectionError:
                    break
                if not chunk:
                    break
                data += chunk
    finally:
        writer.close()
    return _parsed(data, time.monotonic() - started)


def _whole(data: bytes) -> bool:
    head, found, body = data.partition(b"\r\n\r\n")
    if not found:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


def _parsed(data: bytes, seconds: float) -> Raw:
    if not data:
        return Raw(None, {}, b"", seconds)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Raw(int(lines[0].split()[1]), headers, body, seconds)


def request_bytes(path: str, body: bytes, *extra: bytes, method: bytes = b"POST") -> bytes:
    head = [method + b" " + path.encode() + b" HTTP/1.1", b"Host: gateway",
            b"Content-Type: application/json", b"Content-Length: %d" % len(body),
            *extra]  # fmt: skip
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def chat_body(**changes: Any) -> bytes:
    body = {"model": LLAMA, "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4} | changes  # fmt: skip
    return orjson.dumps(body)


async def held(fleet: Fleet) -> dict[str, Any]:
    """What each region holds now: workers' and peers' in-flight counts and admission."""
    out = {}
    for region in fleet.agents:
        status = await fleet.status(region)
        out[region] = {
            "workers": {w: v["inflight"] for w, v in status["router"]["workers"].items()
                        if v["inflight"]},
            "peers": {p: v["inflight"] for p, v in status["escalation"]["peers"].items()
                      if v["inflight"]},
            "waiting": {m: n for m, n in status["admission"]["waiting"].items() if n},
        }  # fmt: skip
    return out


async def nothing_held(fleet: Fleet, within_s: float = 15.0) -> None:
    """Every region comes back to holding nothing, and serves a normal request."""
    empty: dict[str, Any] = {r: {"workers": {}, "peers": {}, "waiting": {}} for r in fleet.agents}
    last: dict[str, Any] = {}

    async def idle() -> bool:
        last.update(await held(fleet))
        return last == empty

    try:
        await eventually(idle, within_s=within_s)
    except TimeoutError:
        raise AssertionError(f"still held: {last}") from None
    for region in fleet.agents:
        client = fleet.client(region)
        answer = await client.chat.completions.create(
            model=LLAMA, messages=[{"role": "user", "content": "still there?"}], max_tokens=2
        )
        await client.close()
        assert answer.choices[0].message.content
