"""An approximate prefix index of what each worker holds in its KV cache, with bounded memory.

A prompt is cut into blocks of a fixed number of bytes, each block hashed with the hash of
the one before it, so a block hash stands for the whole prefix up to it; the first is hashed
with its cache namespace's root (each tenant's prefixes are its own, as in the engines). The
index maps block hashes to the workers that have seen them, and keeps a least-recently-used
list per worker, capped in blocks. It is built from what the router sent (as SGLang's own
router does); a worker's KV-cache events correct it where the engine publishes them.
"""

from __future__ import annotations

from collections import OrderedDict


def salt_root(salt: str | None) -> int:
    """Where a cache namespace's chains start: a request's blocks under one `cache_salt` (one
    tenant's, agents/gateway/requests.py) are never another's, as in the engine's cache."""
    return hash(("cache_salt", salt)) if salt else 0


class PrefixIndex:
    def __init__(self, block_bytes: int, capacity_blocks: int) -> None:
        self.block_bytes = block_bytes
        self.capacity_blocks = capacity_blocks
        self._holders: dict[int, set[str]] = {}
        self._lru: dict[str, OrderedDict[int, None]] = {}

    def hashes(self, key: bytes, root: int = 0) -> list[int]:
        """The chained hashes of the key's whole blocks, from `root` (`salt_root`)."""
        out: list[int] = []
        h, size = root, self.block_bytes
        for start in range(0, len(key) - size + 1, size):
            h = hash((h, key[start : start + size]))
            out.append(h)
        return out

    def match(self, hashes: list[int]) -> dict[str, int]:
        """For each worker holding at least the first block: how many leading blocks it has."""
        counts: dict[str, int] = {}
        alive: set[str] | None = None
        depth = 0
        for h in hashes:
            holders = self._holders.get(h)
            if not holders:
                break
            now = set(holders) if alive is None else alive & holders
            if alive is not None:
                for worker in alive - now:
                    counts[worker] = depth
            if not now:
                alive = now
                break
            alive, depth = now, depth + 1
        for worker in alive or ():
            counts[worker] = depth
        return counts

    def insert(self, worker: str, hashes: list[int]) -> None:
        """The worker now holds these blocks. Touched last block first, so that on eviction a
        prompt's tail goes before the prefix it shares with others."""
        lru = self._lru.setdefault(worker, OrderedDict())
        for h in reversed(hashes):
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                self._holders.setdefault(h, set()).add(worker)
        while len(lru) > self.capacity_blocks:
            old, _ = lru.popitem(last=False)
            self._drop(old, worker)

    def remove(self, worker: str, hashes: list[int]) -> None:
        lru = self._lru.get(worker)
        if lru is None:
            return
        for h in hashes:
            if lru.pop(h, 0) is None:
                self._drop(h, worker)

    def clear(self, worker: str) -> None:
        for h in self._lru.pop(worker, OrderedDict()):
            self._drop(h, worker)

    def size(self, worker: str) -> int:
        """Blocks held for the worker."""
        lru = self._lru.get(worker)
        return len(lru) if lru is not None else 0

    def forget_others(self, keep: set[str]) -> None:
        for worker in [w for w in self._lru if w not in keep]:
            self.clear(worker)

    def _drop(self, h: int, worker: str) -> None:
        holders = self._holders.get(h)
        if holders is not None:
            holders.discard(worker)
            if not holders:
                del self._holders[h]
