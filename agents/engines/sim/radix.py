"""A radix tree of cached token prefixes with a capacity in tokens and LRU eviction.

It follows SGLang's RadixCache: edges hold runs of tokens, a request's prompt is matched
against the tree of its namespace (its `cache_salt`: a tree per salt) for its cached prefix,
the sequence is inserted once computed, and when the tree is over capacity the least
recently used leaves that no running request holds are evicted first.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Sequence

Tokens = Sequence[int]


Salt = str | None  # a cache namespace (SGLang's `cache_salt`): a prefix is cached per salt
LORA = "\x00lora\x00"  # in a namespace, before the adapter's name: SGLang keys its cache by
# adapter too (the request's lora id is part of its `extra_key`)


def namespace(salt: str | None, adapter: str | None) -> Salt:
    """The cache namespace of a request with this `cache_salt` and this LoRA adapter."""
    return salt if adapter is None else f"{salt or ''}{LORA}{adapter}"


def namespace_parts(space: Salt) -> tuple[str | None, str | None]:
    """(cache_salt, adapter) of a namespace."""
    if space is None or LORA not in space:
        return space, None
    salt, _, adapter = space.partition(LORA)
    return salt or None, adapter


class Listener:
    """Told of each run of tokens that enters or leaves the cache (the KV-event publisher)."""

    def stored(self, sequence: Tokens, start: int, salt: Salt = None) -> None:
        """`sequence[start:]` was added after the cached prefix `sequence[:start]`."""

    def removed(self, sequence: Tokens, start: int, salt: Salt = None) -> None:
        """`sequence[start:]` was evicted; `sequence[:start]` stays."""

    def cleared(self) -> None: ...

    async def flush(self) -> None:
        """Called after each scheduler step: send what the step changed."""


class Node:
    __slots__ = ("children", "key", "last_access", "lock_ref", "parent")

    def __init__(self, key: tuple[int, ...], parent: Node | None, now: float) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.last_access = now
        self.lock_ref = 0


class RadixCache:
    def __init__(
        self,
        capacity_tokens: int,
        clock: Callable[[], float] = time.monotonic,
        listener: Listener | None = None,
    ) -> None:
        if capacity_tokens < 0:
            raise ValueError("capacity_tokens must not be negative")
        self.capacity = capacity_tokens
        self._clock = clock
        self.listener = listener or Listener()
        self.roots: dict[Salt, Node] = {}  # a tree per cache namespace
        self._salt: dict[int, Salt] = {}  # id of a root: its namespace
        self.size = 0  # tokens held
        self.protected = 0  # tokens held by running requests, not evictable

    @property
    def evictable(self) -> int:
        return self.size - self.protected

    def _root(self, salt: Salt) -> Node:
        root = self.roots.get(salt)
        if root is None:
            root = self.roots[salt] = Node((), None, self._clock())
            self._salt[id(root)] = salt
        return root

    def match(self, tokens: Tokens, salt: Salt = None, create: bool = False) -> tuple[int, Node]:
        """How many leading tokens are cached (under `salt`), and the node where the match
        ends (a namespace not cached: an empty node outside the tree, unless `create`)."""
        root = self._root(salt) if create else self.roots.get(salt)
        if root is None:
            return 0, Node((), None, self._clock())
        node, matched, now = root, 0, self._clock()
        node.last_access = now
        while matched < len(tokens):
            child = node.children.get(tokens[matched])
            if child is None:
                break
            common = _common(child.key, tokens, matched)
            child.last_access = now
            if common < len(child.key):
                node = self._split(child, common)
                matched += common
                break
            node, matched = child, matched + common
        return matched, node

    def insert(self, tokens: Tokens, salt: Salt = None) -> int:
        """Cache a computed sequence; returns how many tokens were new. May evict others."""
        matched, node = self.match(tokens, salt, create=True)
        new = len(tokens) - matched
        if new == 0:
            return 0
        self.lock(node)  # the prefix we extend must survive the eviction below
        try:
            self.evict(self.size + new - self.capacity)
        finally:
            self.unlock(node)
        room = min(new, self.capacity - self.size)
        if room <= 0:
            return 0
        leaf = Node(tuple(tokens[matched : matched + room]), node, self._clock())
        node.children[leaf.key[0]] = leaf
        self.size += room
        self.listener.stored(tokens[: matched + room], matched, salt)
        return room

    def lock(self, node: Node) -> None:
        """A running request holds this prefix: it and its ancestors are not evicted."""
        current: Node | None = node
        while current is not None:
            if current.lock_ref == 0:
                self.protected += len(current.key)
            current.lock_ref += 1
            current = current.parent

    def unlock(self, node: Node) -> None:
        current: Node | None = node
        while current is not None:
            current.lock_ref -= 1
            if current.lock_ref == 0:
                self.protected -= len(current.key)
            current = current.parent

    def evict(self, tokens: int) -> int:
        """Free at least `tokens` tokens if unlocked leaves allow; returns how many freed."""
        if tokens <= 0:
            return 0
        order = itertools.count()
        heap = [(n.last_access, next(order), n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            freed += len(leaf.key)
            path, root = _path(leaf)
            self.listener.removed(path, len(path) - len(leaf.key), self._salt[id(root)])
            if parent is not root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, next(order), parent))
            elif parent is root and not root.children and root.lock_ref == 0:
                del self.roots[self._salt.pop(id(root))]  # an empty namespace: nothing kept
        self.size -= freed
        return freed

    def reset(self) -> None:
        self.roots.clear()
        self._salt.clear()
        self.size = self.protected = 0
        self.listener.cleared()

    def _split(self, child: Node, at: int) -> Node:
        """Cut `child`'s edge after `at` tokens; returns the new middle node."""
        parent = child.parent
        assert parent is not None
        middle = Node(child.key[:at], parent, child.last_access)
        middle.lock_ref = child.lock_ref
        parent.children[middle.key[0]] = middle
        child.key = child.key[at:]
        child.parent = middle
        middle.children[child.key[0]] = child
        return middle

    def _leaves(self) -> list[Node]:
        found, stack = [], list(self.roots.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node.parent is not None:
                found.append(node)
        return found


def _path(node: Node) -> tuple[list[int], Node]:
    """The tokens from the root to the end of the node, and the root."""
    keys: list[tuple[int, ...]] = [node.key]
    root = node
    while root.parent is not None:
        root = root.parent
        keys.append(root.key)
    return [t for key in reversed(keys) for t in key], root


def _common(key: tuple[int, ...], tokens: Tokens, start: int) -> int:
    n = min(len(key), len(tokens) - start)
    i = 0
    while i < n and key[i] == tokens[start + i]:
        i += 1
    return i
