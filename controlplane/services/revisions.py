"""Where a committed revision is announced, so that pushers and other replicas hear of it.

Writers call `published(revision)` after their transaction has committed. Listeners (the
snapshot hub, the etcd fan-out) are called in order and must not raise; a lost announcement
is harmless because the hub also polls the revision (level-triggered).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

Listener = Callable[[int], Awaitable[None]]


class RevisionFeed:
    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def published(self, revision: int | None) -> None:
        if revision is None:
            return
        for listener in self._listeners:
            try:
                await listener(revision)
            except Exception:
                log.exception("a revision listener failed", extra={"revision": revision})
