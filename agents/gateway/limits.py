"""What one request may ask of the gateway before any of it is read: its body's size and the
time its sender may take, and how long a stream's client may read nothing."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp import web

from agents.gateway.errors import BodyTooLarge, RequestTimeout


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the gateway before any of it is read."""

    max_body_bytes: int = 16 * 1024 * 1024
    body_timeout_s: float = 30.0  # from the head to the body's last byte
    client_stall_s: float = 30.0  # a stream whose client reads nothing this long is cut


LIMITS = web.AppKey("limits", Limits)  # on the agent's app: what relays read of them


DEFAULT_LIMITS = Limits()


async def read_body(request: web.Request, limits: Limits) -> bytes:
    """The body, bounded in size (refused before it is read when its length says so) and in
    the time its sender may take."""
    limit = limits.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(f"the body is over {limit} bytes")
    try:
        if request.content.is_eof():  # it came whole with the head: no timer to arm
            return await request.read()
        async with asyncio.timeout(limits.body_timeout_s):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BodyTooLarge(f"the body is over {limit} bytes") from None
    except TimeoutError:
        raise RequestTimeout(
            f"the body did not arrive within {limits.body_timeout_s:g} s"
        ) from None
