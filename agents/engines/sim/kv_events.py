"""KV-cache events over ZMQ in SGLang's format, for routers that keep an exact prefix index.

Started with `--kv-events-config '{"publisher":"zmq","endpoint":"tcp://*:5557",
"topic":"kv-events"}'`, the simulator publishes on a ZMQ PUB socket, one message per
scheduler step that changed the cache: frames `[topic, seq (8-byte big-endian), payload]`,
the payload msgpack `[ts, events, dp_rank]` with events as SGLang 0.5.23 sends them, maps
tagged by `type`:

    {"type": "BlockStored", "block_hashes": [...], "parent_block_hash": int | None,
     "token_ids": [...], "block_size": N, "lora_id": None, "medium": "GPU",
     "cache_salt": its salt (when it has one), "lora_name": its LoRA adapter (when it has one)}
    {"type": "BlockRemoved", "block_hashes": [...], "medium": "GPU"}
    {"type": "AllBlocksCleared"}

One BlockStored covers a whole inserted run, a hash a page. A block is a page of
`--page-size` tokens; only whole pages are published. A block's hash is chained (it stands
for the whole prefix up to it), so equal pages under different prefixes never share a hash.
The cache is kept per salt and per adapter: SGLang folds the request's adapter into its
cache key, and names it in BlockStored as `lora_name` (its `lora_id` is always None on
0.5.23). Events are queued as the cache changes and sent once per step; what is sent before a
subscriber joins is lost to it, as with SGLang.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import time
from collections.abc import Sequence
from typing import Any

import msgpack
import zmq
from pydantic import BaseModel, ConfigDict, Field

from agents.engines.sim.radix import Listener, namespace_parts

ROOT_HASH = 0


class KvEventsConfig(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    publisher: str = Field(default="zmq", pattern="^(zmq|null)$")
    endpoint: str = "tcp://*:5557"
    topic: str = "kv-events"


def block_hash(parent: int, tokens: Sequence[int]) -> int:
    """A signed 64-bit hash of the page and everything before it."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(parent.to_bytes(8, "little", signed=True))
    digest.update(b"".join(t.to_bytes(4, "little", signed=False) for t in tokens))
    return int.from_bytes(digest.digest(), "little", signed=True)


def page_hashes(sequence: Sequence[int], page: int, upto: int) -> list[int]:
    """The chained hashes of the first `upto // page` whole pages."""
    out, parent = [], ROOT_HASH
    for start in range(0, upto - page + 1, page):
        parent = block_hash(parent, sequence[start : start + page])
        out.append(parent)
    return out


class KvEvents(Listener):
    """Turns the radix cache's changes into SGLang's events; `flush` sends what is queued."""

    def __init__(self, config: KvEventsConfig, page_size: int, dp_rank: int = 0) -> None:
        self.config = config
        self.page = max(1, page_size)
        self.dp_rank = dp_rank
        self.pending: list[dict[str, Any]] = []
        self.seq = 0
        # a plain socket, sent to without blocking: a PUB socket drops past its high-water
        # mark rather than waiting, so publishing never holds the scheduler's step up
        self._socket: zmq.Socket[bytes] | None = None
        if config.publisher == "zmq":
            self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
            self._socket = self._context.socket(zmq.PUB)
            self._socket.setsockopt(zmq.SNDHWM, 100_000)
            self._socket.setsockopt(zmq.LINGER, 0)
            self._bind(config.endpoint)

    def _bind(self, endpoint: str, attempts: int = 30) -> None:
        """Bind, waiting a little while the port is taken (a subscriber's reconnect to the
        dead port of an earlier engine may hold it for a moment)."""
        assert self._socket is not None
        for attempt in range(attempts):
            try:
                self._socket.bind(endpoint)
                return
            except zmq.ZMQError as error:
                if error.errno != errno.EADDRINUSE or attempt == attempts - 1:
                    raise
                time.sleep(0.1)

    def stored(self, sequence: Sequence[int], start: int, space: str | None = None) -> None:
        salt, adapter = namespace_parts(space)
        first = start // self.page  # the first page that was not whole before
        hashes = page_hashes(sequence, self.page, len(sequence))
        if first >= len(hashes):
            return
        self.pending.append({
            "type": "BlockStored",
            "block_hashes": hashes[first:],
            "parent_block_hash": hashes[first - 1] if first else None,
            "token_ids": list(sequence[first * self.page : len(hashes) * self.page]),
            "block_size": self.page,
            "lora_id": None,  # as SGLang 0.5.23 sends it: the adapter goes by its name
            "medium": "GPU",
        } | ({"cache_salt": salt} if salt else {})
          | ({"lora_name": adapter} if adapter else {}))  # fmt: skip

    def removed(self, sequence: Sequence[int], start: int, salt: str | None = None) -> None:
        first = start // self.page
        hashes = page_hashes(sequence, self.page, len(sequence))
        if first < len(hashes):
            self.pending.append(
                {"type": "BlockRemoved", "block_hashes": hashes[first:], "medium": "GPU"}
            )

    def cleared(self) -> None:
        self.pending.append({"type": "AllBlocksCleared"})

    async def flush(self) -> None:
        if not self.pending:
            return
        events, self.pending = self.pending, []
        if self._socket is None:
            return
        payload = msgpack.packb([time.time(), events, self.dp_rank], use_bin_type=True)
        frames = [self.config.topic.encode(), self.seq.to_bytes(8, "big"), payload]
        self.seq += 1
        with contextlib.suppress(zmq.Again):  # past the high-water mark: dropped
            self._socket.send_multipart(frames, flags=zmq.NOBLOCK)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
